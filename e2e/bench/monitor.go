package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/procfs"
)

// Monitor watches the machine while the bench runs, so that the report can
// say when other work shared the cores: the CPU busy time of the whole
// machine, and "foreign" processes, i.e. Go toolchain and test binaries other
// than this one, and Nomad agents this process did not start.
type Monitor struct {
	began    time.Time
	self     int
	mine     map[int]bool // this process and its ancestors (e.g. `go test`, make)
	interval time.Duration

	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	samples []monSample
}

type monSample struct {
	at      time.Duration // since began
	busyPct float64       // machine CPU busy since the previous sample, % of one core
	foreign []string      // distinct descriptions, sorted
}

// foreignTools are process names that mean someone is building or testing.
var foreignTools = []string{"go", "compile", "link", "vet", "asm", "cgo", "gopls"}

// StartMonitor samples every interval until Stop.
func StartMonitor(began time.Time, interval time.Duration) *Monitor {
	m := &Monitor{began: began, self: os.Getpid(), mine: map[int]bool{}, interval: interval, stop: make(chan struct{}), done: make(chan struct{})}
	for pid := m.self; pid > 1 && !m.mine[pid]; pid = parentOf(pid) {
		m.mine[pid] = true
	}
	go m.run()
	return m
}

func (m *Monitor) run() {
	defer close(m.done)
	tick := time.NewTicker(m.interval)
	defer tick.Stop()
	prevBusy, prevTotal, _ := cpuTicks()
	for {
		select {
		case <-m.stop:
			return
		case <-tick.C:
		}
		busy, total, err := cpuTicks()
		s := monSample{at: time.Since(m.began), foreign: m.foreign()}
		if err == nil && total > prevTotal {
			// total counts every core; busy/total is the busy share of all cores.
			s.busyPct = float64(busy-prevBusy) / float64(total-prevTotal) * 100 * float64(numCPU())
		}
		prevBusy, prevTotal = busy, total
		m.mu.Lock()
		m.samples = append(m.samples, s)
		m.mu.Unlock()
	}
}

// Window is a stretch of time in which foreign processes ran.
type Window struct {
	From, To time.Duration // since the bench began
	What     []string      // the foreign processes seen
	PeakPct  float64       // the machine's peak CPU use then, % of one core
}

func (w Window) String() string {
	return fmt.Sprintf("%s–%s: %s (machine CPU use up to %.0f %% of one core)",
		clock(w.From), clock(w.To), strings.Join(w.What, ", "), w.PeakPct)
}

// Stop ends sampling and returns the stretches of time in which foreign
// processes ran.
func (m *Monitor) Stop() []Window {
	close(m.stop)
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Window
	for i := 0; i < len(m.samples); {
		if len(m.samples[i].foreign) == 0 {
			i++
			continue
		}
		j := i
		names := map[string]bool{}
		peak := 0.0
		for j < len(m.samples) && len(m.samples[j].foreign) > 0 {
			for _, f := range m.samples[j].foreign {
				names[f] = true
			}
			peak = max(peak, m.samples[j].busyPct)
			j++
		}
		out = append(out, Window{From: max(0, m.samples[i].at-m.interval), To: m.samples[j-1].at, What: sortedSet(names), PeakPct: peak})
		i = j
	}
	return out
}

func clock(d time.Duration) string {
	d = max(d, 0)
	return fmt.Sprintf("%02d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// foreign lists the foreign processes running now.
func (m *Monitor) foreign() []string {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || m.mine[pid] {
			continue
		}
		stat, err := procfs.Read(pid)
		if err != nil || stat.State == 'Z' {
			continue
		}
		comm, ppid := stat.Comm, stat.PPID
		switch {
		case slices.Contains(foreignTools, comm), strings.HasSuffix(comm, ".test"):
			seen[comm] = true
		case comm == "nomad" && ppid != m.self:
			if argv, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil {
				args := strings.Split(string(argv), "\x00")
				if len(args) > 1 && args[1] == "agent" {
					seen["a nomad agent not started by the bench ("+filepath.Base(args[0])+")"] = true
				}
			}
		}
	}
	return sortedSet(seen)
}

// parentOf returns the parent PID of pid, or 0.
func parentOf(pid int) int {
	stat, _ := procfs.Read(pid)
	return stat.PPID
}

// cpuTicks reads the machine's busy and total CPU time from /proc/stat.
func cpuTicks() (busy, total int64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("unexpected /proc/stat: %q", line)
	}
	var v [8]int64
	for i := range v {
		v[i], _ = strconv.ParseInt(f[i+1], 10, 64)
	}
	// user nice system idle iowait irq softirq steal
	busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
	return busy, busy + v[3] + v[4], nil
}

// MachineCPU measures the whole machine's CPU use over a window, as % of
// one core.
type MachineCPU struct{ busy, total int64 }

// StartMachineCPU begins a window.
func StartMachineCPU() MachineCPU {
	b, t, _ := cpuTicks()
	return MachineCPU{busy: b, total: t}
}

// Percent is the machine's CPU use since the window began.
func (w MachineCPU) Percent() float64 {
	b, t, err := cpuTicks()
	if err != nil || t <= w.total {
		return nan
	}
	return float64(b-w.busy) / float64(t-w.total) * 100 * float64(numCPU())
}

func numCPU() int {
	n := 0
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "cpu") && len(l) > 3 && l[3] >= '0' && l[3] <= '9' {
			n++
		}
	}
	return max(n, 1)
}
