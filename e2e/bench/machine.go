package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/internal/loadavg"
)

// Machine describes where the numbers were taken.
type Machine struct {
	CPUModel string
	Cores    int
	Memory   string
	Kernel   string
	OS       string
	Cgroups  string
	Go       string
	Nomad    string
	Lock     string
	Commit   string
	// LoadAtStart and LoadAtEnd are /proc/loadavg's 1, 5 and 15 minute
	// averages: other work on the machine shows up here.
	LoadAtStart, LoadAtEnd string
}

// LoadAvg returns the 1, 5 and 15 minute load averages.
func LoadAvg() string { return loadavg.Read() }

// ReadMachine reads the host's description and the versions of the binaries
// under test. Anything it cannot read is reported as "unknown".
func ReadMachine(repoRoot, nomadBin, lockBin string) Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version(), LoadAtStart: LoadAvg()}
	m.CPUModel = firstField("/proc/cpuinfo", "model name")
	if kb, err := strconv.ParseFloat(strings.Fields(firstField("/proc/meminfo", "MemTotal") + " x")[0], 64); err == nil {
		m.Memory = fmt.Sprintf("%.1f GiB", kb/1024/1024)
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		m.Kernel = unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:]) +
			" " + unix.ByteSliceToString(u.Machine[:])
	}
	m.OS = strings.Trim(firstField("/etc/os-release", "PRETTY_NAME"), `"`)
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		m.Cgroups = "v2"
	} else {
		m.Cgroups = "v1"
	}
	m.Nomad = firstLine(run(repoRoot, nomadBin, "version"))
	m.Lock = firstLine(run(repoRoot, lockBin, "version"))
	m.Commit = firstLine(run(repoRoot, "git", "describe", "--always", "--dirty"))
	for _, p := range []*string{&m.CPUModel, &m.Memory, &m.Kernel, &m.OS, &m.Nomad, &m.Lock, &m.Commit} {
		if *p == "" {
			*p = "unknown"
		}
	}
	return m
}

// firstField returns the value of the first "key: value" (or key=value) line.
func firstField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		for _, sep := range []string{":", "="} {
			k, v, ok := strings.Cut(line, sep)
			if ok && strings.TrimSpace(k) == key {
				return strings.TrimSpace(v)
			}
		}
	}
	return ""
}

func run(dir, name string, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return string(out)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(line)
}
