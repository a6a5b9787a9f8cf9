// Package procfs reads a process's /proc/<pid>/stat line (proc(5)): the one
// place the project parses it. It reads Linux's format only and keeps only
// the fields the driver and the supervisor use.
package procfs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// ClockTick is the unit of the time fields (USER_HZ, 100 on Linux).
const ClockTick = 10 * time.Millisecond

// Stat is the part of /proc/<pid>/stat the project uses. Field numbers are
// those of proc(5).
type Stat struct {
	PID  int    // field 1
	Comm string // field 2, without its parentheses; may hold spaces and ')'
	// State is field 3: 'R', 'S', 'D', 'Z' (zombie), 'X' (dead), ...
	State byte
	PPID  int // field 4
	PGRP  int // field 5
	// UTime and STime (fields 14 and 15) are CPU time in user and kernel
	// mode, in clock ticks.
	UTime, STime uint64
	// StartTime (field 22) is when the process started, in clock ticks since
	// boot. With the PID it names one process for good: a reused PID has
	// another start time.
	StartTime uint64
}

// Read reads and parses /proc/<pid>/stat. A process that is gone gives the
// error of os.ReadFile (errors.Is(err, fs.ErrNotExist) or ESRCH).
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	s, err := Parse(b)
	if err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return s, nil
}

// Parse parses one /proc/<pid>/stat line. The comm field is whatever lies
// between the first '(' and the last ')': a process may name itself with
// spaces and parentheses, so splitting the whole line on spaces would shift
// every later field.
func Parse(b []byte) (Stat, error) {
	open, closing := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 1 || closing < open {
		return Stat{}, fmt.Errorf("malformed stat line %q: no (comm)", excerpt(b))
	}
	var s Stat
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return Stat{}, fmt.Errorf("malformed stat line %q: pid: %w", excerpt(b), err)
	}
	s.PID, s.Comm = pid, string(b[open+1:closing])
	// rest[0] is field 3, so field n is rest[n-3].
	rest := bytes.Fields(b[closing+1:])
	const last = 22
	if len(rest) < last-2 {
		return Stat{}, fmt.Errorf("short stat line %q: %d fields, want at least %d", excerpt(b), len(rest)+2, last)
	}
	if len(rest[0]) != 1 {
		return Stat{}, fmt.Errorf("malformed stat line %q: state %q", excerpt(b), rest[0])
	}
	s.State = rest[0][0]
	ints := []struct {
		field int
		dst   *int
	}{{4, &s.PPID}, {5, &s.PGRP}}
	for _, f := range ints {
		if *f.dst, err = strconv.Atoi(string(rest[f.field-3])); err != nil {
			return Stat{}, fmt.Errorf("malformed stat line %q: field %d: %w", excerpt(b), f.field, err)
		}
	}
	uints := []struct {
		field int
		dst   *uint64
	}{{14, &s.UTime}, {15, &s.STime}, {22, &s.StartTime}}
	for _, f := range uints {
		if *f.dst, err = strconv.ParseUint(string(rest[f.field-3]), 10, 64); err != nil {
			return Stat{}, fmt.Errorf("malformed stat line %q: field %d: %w", excerpt(b), f.field, err)
		}
	}
	return s, nil
}

// Gone reports whether the process has exited: a zombie ('Z') or dead ('X').
// A zombie thread-group leader may still have live threads; callers that
// care check /proc/<pid>/task.
func (s Stat) Gone() bool { return s.State == 'Z' || s.State == 'X' }

// CPU is the process's user and system CPU time.
func (s Stat) CPU() (user, system time.Duration) {
	return time.Duration(s.UTime) * ClockTick, time.Duration(s.STime) * ClockTick
}

func excerpt(b []byte) string {
	const max = 80
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}
