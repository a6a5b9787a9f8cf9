package harness

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestOverNeedsProof: two allocations seen in one /proc scan count as "at
// once" only when the exits prove both alive at one moment.
func TestOverNeedsProof(t *testing.T) {
	// One scan saw A (alloc a) at 100 and B (alloc b) at 140.
	smp := Sample{PIDs: []int{1, 2}, Allocs: []string{"a", "b"}, Procs: []Sighted{
		{PID: 1, Owner: "a", Seen: 100},
		{PID: 2, Owner: "b", Seen: 140},
	}}
	tests := []struct {
		name  string
		exits map[int]int64
		alive map[int]bool
		want  bool
	}{
		{"A exited before B was seen: a handover, not an overlap", map[int]int64{1: 120, 2: 500}, nil, false},
		{"A exited after B was seen", map[int]int64{1: 141, 2: 500}, nil, true},
		{"A still running at the end", map[int]int64{2: 500}, map[int]bool{1: true}, true},
		{"A's exit unknown (gone before it was watched)", map[int]int64{2: 500}, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sum := SampleSummary{Samples: []Sample{smp}, Exits: tc.exits, AliveAtStop: tc.alive}
			if got := len(sum.Over(1)) == 1; got != tc.want {
				t.Errorf("Over(1) counts the sample: %t, want %t", got, tc.want)
			}
			if len(sum.Over(2)) != 0 {
				t.Errorf("Over(2) counts a sample of two allocations")
			}
		})
	}
}

// TestSamplerExactExit: the sampler's pidfd dates a killed process's exit
// between the kill and the first scan that misses it, and GoneByPID uses it.
func TestSamplerExactExit(t *testing.T) {
	marker := "exact-exit-" + time.Now().Format("150405.000000000")
	cmd := exec.Command("sleep", "60")
	cmd.Env = append(os.Environ(), "E2E_MARKER="+marker)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := make(chan struct{})
	go func() { _ = cmd.Wait(); close(reaped) }()
	start := MonoNow() // the process runs already; every scan comes after this
	s := StartSampler(t, SamplerOptions{Marker: marker})
	s.WaitSeen(t, 30*time.Second, cmd.Process.Pid)
	killAt := MonoNow()
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Wait for the events themselves, not for a time they usually take:
	// the pidfd saw the exit, and the process is reaped, so the final scan
	// of Stop cannot see it.
	w := s.watch(cmd.Process.Pid)
	if w == nil {
		t.Fatalf("the sampler saw %d alive but watches no exit of it", cmd.Process.Pid)
	}
	if _, ok := w.Wait(30 * time.Second); !ok {
		t.Fatalf("the sampler's pidfd saw no exit of %d within 30s of the kill", cmd.Process.Pid)
	}
	select {
	case <-reaped:
	case <-time.After(30 * time.Second):
		t.Fatalf("%d not reaped within 30s of the kill", cmd.Process.Pid)
	}
	sum := s.Stop()
	exit, ok := sum.Exits[cmd.Process.Pid]
	if !ok || exit < killAt {
		t.Fatalf("exit of %d: %d %t, want one after the kill at %d", cmd.Process.Pid, exit, ok, killAt)
	}
	scan, ok := sum.goneAfter(start, func(smp Sample) bool {
		for _, pid := range smp.PIDs {
			if pid == cmd.Process.Pid {
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no scan missed pid %d after the kill", cmd.Process.Pid)
	}
	// Both bound the exit from above (the pidfd's by a thread wake-up, the
	// scan's by its length); GoneByPID takes the tighter.
	if got, ok := sum.GoneByPID()(Interval{PID: cmd.Process.Pid, Start: start}); !ok || got != min(exit, scan) {
		t.Errorf("GoneByPID = %d %t, want min(pidfd exit %d, scan bound %d)", got, ok, exit, scan)
	}
}
