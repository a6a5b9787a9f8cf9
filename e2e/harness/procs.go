package harness

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Proc is a snapshot of one live process, read from /proc.
type Proc struct {
	PID, PPID, PGID int
	Comm            string   // kernel command name (at most 15 bytes)
	Exe             string   // resolved executable path ("" if unreadable)
	Argv            []string // command line
	// Selected environment variables (from the process's initial environ).
	AllocID  string // NOMAD_ALLOC_ID
	Fence    string // NOMAD_LOCK_FENCE
	LockPath string // NOMAD_LOCK_PATH
	// Seen is a moment (CLOCK_MONOTONIC ns) at which the scan knew the
	// process alive: taken after its stat showed no zombie and before its
	// command line was read.
	Seen int64

	zombie bool
	env    []string
}

// IsTestWorkload reports whether the process runs the e2e testworkload binary
// (either role). Wrappers such as `nomad var lock` or the lock shim carry the
// workload's arguments and environment too, so counting workloads by marker
// alone would count them as well.
func (p Proc) IsTestWorkload() bool {
	return p.Comm == "testworkload" || filepath.Base(strings.TrimSuffix(p.Exe, " (deleted)")) == "testworkload"
}

// IsWorkloadChild reports whether the process is a testworkload grandchild
// (started by -children).
func (p Proc) IsWorkloadChild() bool {
	if !p.IsTestWorkload() || len(p.Argv) == 0 {
		return false
	}
	for _, a := range p.Argv[1:] {
		if a == "--" {
			break
		}
		if a == "-child" || a == "--child" {
			return true
		}
	}
	return false
}

// IsMainWorkload reports whether the process is a testworkload in its main
// role: the process a supervisor started, as opposed to a grandchild.
func (p Proc) IsMainWorkload() bool { return p.IsTestWorkload() && !p.IsWorkloadChild() }

// String is a one-line description for test logs.
func (p Proc) String() string {
	return fmt.Sprintf("pid=%d ppid=%d pgid=%d alloc=%s fence=%s argv=%q", p.PID, p.PPID, p.PGID, short(p.AllocID), p.Fence, p.Argv)
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// FindProcs returns every live (non-zombie) process, other than the caller,
// whose argv or environment contains marker, sorted by PID. Processes that
// vanish during the scan are skipped. Use a marker unique to the test, e.g.
// an env var value or an argv element such as `-marker <test name>`. Filter
// the result with Proc.IsMainWorkload to count workloads only.
func FindProcs(marker string) ([]Proc, error) {
	if marker == "" {
		return nil, fmt.Errorf("FindProcs: empty marker would match every process")
	}
	return scanProcs(func(p Proc) bool { return p.contains(marker) })
}

// scanProcs returns the live processes, other than the caller, that keep
// says to keep, sorted by PID. Processes that vanish meanwhile are skipped.
func scanProcs(keep func(Proc) bool) ([]Proc, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var out []Proc
	var buf []byte
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		p, err := readProc(pid, &buf)
		if err != nil || p.zombie || !keep(p) {
			continue
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out, nil
}

func (p Proc) contains(marker string) bool {
	for _, a := range p.Argv {
		if strings.Contains(a, marker) {
			return true
		}
	}
	for _, kv := range p.env {
		if strings.Contains(kv, marker) {
			return true
		}
	}
	return false
}

// readProc reads one process's stat, cmdline, environ and exe, with buf
// as scratch space (see readProcFile).
func readProc(pid int, buf *[]byte) (Proc, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	stat, err := readProcFile(filepath.Join(dir, "stat"), buf)
	if err != nil {
		return Proc{}, err
	}
	p := Proc{PID: pid}
	// Format: pid (comm) state ppid pgrp ...; comm may contain spaces and ')'.
	open, closing := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
	if open < 0 || closing < open {
		return Proc{}, fmt.Errorf("malformed %s/stat", dir)
	}
	p.Comm = string(stat[open+1 : closing])
	fields := strings.Fields(string(stat[closing+1:]))
	if len(fields) < 3 {
		return Proc{}, fmt.Errorf("malformed %s/stat", dir)
	}
	p.zombie = fields[0] == "Z" || fields[0] == "X"
	p.PPID, _ = strconv.Atoi(fields[1])
	p.PGID, _ = strconv.Atoi(fields[2])
	if p.zombie {
		return p, nil
	}
	p.Seen = MonoNow()
	if cmdline, err := readProcFile(filepath.Join(dir, "cmdline"), buf); err == nil {
		p.Argv = splitNUL(cmdline)
	}
	if environ, err := readProcFile(filepath.Join(dir, "environ"), buf); err == nil {
		p.env = splitNUL(environ)
	}
	p.Exe, _ = os.Readlink(filepath.Join(dir, "exe"))
	for _, kv := range p.env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "NOMAD_ALLOC_ID":
			p.AllocID = v
		case "NOMAD_LOCK_FENCE":
			p.Fence = v
		case "NOMAD_LOCK_PATH":
			p.LockPath = v
		}
	}
	return p, nil
}

// readProcFile reads a /proc file into *buf, grown as needed, and returns
// the bytes read, valid until the next call with buf. Bare syscalls: a
// scan reads four files of every process on the machine, and os.ReadFile's
// fstat and poller registration double what that costs (with many tests
// side by side, hundreds of processes, every few tens of ms).
func readProcFile(path string, buf *[]byte) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if len(*buf) == 0 {
		*buf = make([]byte, 64<<10)
	}
	n := 0
	for {
		if n == len(*buf) {
			*buf = append(*buf, make([]byte, len(*buf))...)
		}
		m, err := unix.Read(fd, (*buf)[n:])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		case m == 0:
			return (*buf)[:n], nil
		}
		n += m
	}
}

func splitNUL(b []byte) []string {
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil
	}
	parts := bytes.Split(b, []byte{0})
	out := make([]string, len(parts))
	for i, part := range parts {
		out[i] = string(part)
	}
	return out
}
