package procfs

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"
)

// line builds a stat line the way the kernel writes it: pid, (comm), then
// fields 3 to 52, with the given values at their proc(5) field numbers and
// 0 elsewhere.
func line(pid, comm string, state string, at map[int]string) string {
	f := make([]string, 52-2)
	for i := range f {
		f[i] = "0"
	}
	f[0] = state
	for n, v := range at {
		f[n-3] = v
	}
	return pid + " (" + comm + ") " + strings.Join(f, " ") + "\n"
}

func TestParse(t *testing.T) {
	typical := map[int]string{4: "1", 5: "123", 14: "250", 15: "30", 22: "987654"}
	tests := []struct {
		name string
		in   string
		want Stat
	}{
		{"plain", line("123", "sleep", "S", typical),
			Stat{PID: 123, Comm: "sleep", State: 'S', PPID: 1, PGRP: 123, UTime: 250, STime: 30, StartTime: 987654}},
		{"comm with spaces and parentheses", line("77", "weird ) (name", "Z", map[int]string{4: "5", 5: "900", 22: "42"}),
			Stat{PID: 77, Comm: "weird ) (name", State: 'Z', PPID: 5, PGRP: 900, StartTime: 42}},
		{"comm that looks like fields", line("8", "x) R 1 2 3", "D", map[int]string{4: "2", 5: "8"}),
			Stat{PID: 8, Comm: "x) R 1 2 3", State: 'D', PPID: 2, PGRP: 8}},
		{"empty comm", line("9", "", "R", map[int]string{4: "1", 5: "9"}),
			Stat{PID: 9, Comm: "", State: 'R', PPID: 1, PGRP: 9}},
		{"every number zero", line("2", "kthreadd", "S", nil),
			Stat{PID: 2, Comm: "kthreadd", State: 'S'}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.in))
			if err != nil || got != tc.want {
				t.Fatalf("Parse(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct{ name, in string }{
		{"garbage", "garbage"},
		{"no pid", "(sleep) S 1 2"},
		{"short (old test fixture shape)", "123 (sleep) S 1 123 123 0 -1"},
		{"two-letter state", line("1", "a", "SS", nil)},
		{"non-numeric ppid", line("1", "a", "S", map[int]string{4: "x"})},
		{"non-numeric start time", line("1", "a", "S", map[int]string{22: "-1"})},
		{"closing before opening", "1 )a( S"},
		{"empty", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if s, err := Parse([]byte(tc.in)); err == nil {
				t.Fatalf("Parse(%q) = %+v, want an error", tc.in, s)
			}
		})
	}
}

func TestGoneAndCPU(t *testing.T) {
	for state, gone := range map[byte]bool{'R': false, 'S': false, 'D': false, 'T': false, 'Z': true, 'X': true} {
		if got := (Stat{State: state}).Gone(); got != gone {
			t.Errorf("Stat{State: %c}.Gone() = %v, want %v", state, got, gone)
		}
	}
	u, s := Stat{UTime: 250, STime: 3}.CPU()
	if u != 2500*time.Millisecond || s != 30*time.Millisecond {
		t.Errorf("CPU() = %v, %v; want 2.5s, 30ms", u, s)
	}
}

func TestReadSelf(t *testing.T) {
	s, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.PID != os.Getpid() || s.PPID != os.Getppid() || s.StartTime == 0 || s.Gone() {
		t.Fatalf("Read(self) = %+v (pid %d, ppid %d)", s, os.Getpid(), os.Getppid())
	}
	again, err := Read(os.Getpid())
	if err != nil || again.StartTime != s.StartTime {
		t.Fatalf("start time changed: %d then %d (%v)", s.StartTime, again.StartTime, err)
	}
}

func TestReadGone(t *testing.T) {
	// PIDs never exceed pid_max (at most 2^22), so this one cannot exist.
	_, err := Read(1 << 23)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Read(no such pid) = %v, want ErrNotExist", err)
	}
}
