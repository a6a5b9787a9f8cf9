package harness

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/proctest"
)

// localWorkload is a testworkload started directly by the test (no Nomad), in
// its own process group.
type localWorkload struct {
	t      *testing.T
	cmd    *exec.Cmd
	record string
	marker string
	done   chan struct{}
	err    error
}

func startLocalWorkload(t *testing.T, args ...string) *localWorkload {
	t.Helper()
	w := &localWorkload{
		t:      t,
		record: filepath.Join(t.TempDir(), "records.jsonl"),
		marker: fmt.Sprintf("wl-%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano()),
		done:   make(chan struct{}),
	}
	full := append([]string{"-record", w.record, "-marker", w.marker}, args...)
	w.cmd = exec.Command(BuildTestWorkload(t), full...)
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := proctest.StartPinned(w.cmd); err != nil {
		t.Fatalf("start testworkload: %v", err)
	}
	go func() { w.err = w.cmd.Wait(); close(w.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL) // the whole group, by its PGID
		select {
		case <-w.done:
		case <-time.After(10 * time.Second):
			t.Errorf("testworkload %d not reaped after SIGKILL", w.cmd.Process.Pid)
		}
	})
	WaitRecord(t, w.record, 10*time.Second, func(r Record) bool { return r.Event == EventStart && r.Role == RoleMain })
	return w
}

func (w *localWorkload) signal(sig syscall.Signal) {
	w.t.Helper()
	if err := w.cmd.Process.Signal(sig); err != nil {
		w.t.Fatalf("signal %v: %v", sig, err)
	}
}

// exitCode waits (bounded) for the process to exit and returns its code, or
// -1 if a signal killed it.
func (w *localWorkload) exitCode(timeout time.Duration) int {
	w.t.Helper()
	select {
	case <-w.done:
	case <-time.After(timeout):
		w.t.Fatalf("testworkload still running after %s", timeout)
	}
	var ee *exec.ExitError
	if w.err == nil {
		return 0
	}
	if errors.As(w.err, &ee) {
		return ee.ExitCode()
	}
	w.t.Fatalf("wait: %v", w.err)
	return 0
}

func (w *localWorkload) alive() bool {
	select {
	case <-w.done:
		return false
	default:
		return true
	}
}

func (w *localWorkload) records() []Record {
	w.t.Helper()
	recs, err := ReadRecords(w.record)
	if err != nil {
		w.t.Fatal(err)
	}
	return recs
}

func events(recs []Record) []string {
	var out []string
	for _, r := range recs {
		e := r.Role + ":" + r.Event
		if r.Signal != "" {
			e += ":" + r.Signal
		}
		out = append(out, e)
	}
	return out
}

// TestTestWorkload checks the workload's behaviours that the e2e tests rely
// on, without Nomad.
func TestTestWorkload(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		act      func(t *testing.T, w *localWorkload)
		wantCode int
		want     []string // events, in order
	}{
		{
			name:     "SIGTERM stops with a stop record",
			act:      func(t *testing.T, w *localWorkload) { w.signal(syscall.SIGTERM) },
			wantCode: 0,
			want:     []string{"main:start", "main:stop:SIGTERM"},
		},
		{
			name:     "SIGINT stops too",
			act:      func(t *testing.T, w *localWorkload) { w.signal(syscall.SIGINT) },
			wantCode: 0,
			want:     []string{"main:start", "main:stop:SIGINT"},
		},
		{
			name: "other signals are recorded and survived",
			act: func(t *testing.T, w *localWorkload) {
				w.signal(syscall.SIGUSR1)
				WaitRecord(t, w.record, 5*time.Second, func(r Record) bool { return r.Signal == "SIGUSR1" })
				w.signal(syscall.SIGHUP)
				WaitRecord(t, w.record, 5*time.Second, func(r Record) bool { return r.Signal == "SIGHUP" })
				if !w.alive() {
					t.Fatal("workload died from SIGUSR1/SIGHUP")
				}
				w.signal(syscall.SIGTERM)
			},
			wantCode: 0,
			want:     []string{"main:start", "main:signal:SIGUSR1", "main:signal:SIGHUP", "main:stop:SIGTERM"},
		},
		{
			name: "-ignore-term survives SIGTERM, only SIGKILL ends it",
			args: []string{"-ignore-term"},
			act: func(t *testing.T, w *localWorkload) {
				w.signal(syscall.SIGTERM)
				r := WaitRecord(t, w.record, 5*time.Second, func(r Record) bool { return r.Signal == "SIGTERM" })
				if !r.Ignored {
					t.Errorf("SIGTERM record not marked ignored: %+v", r)
				}
				time.Sleep(200 * time.Millisecond)
				if !w.alive() {
					t.Fatal("workload died from SIGTERM despite -ignore-term")
				}
				w.signal(syscall.SIGKILL)
			},
			wantCode: -1,
			want:     []string{"main:start", "main:signal:SIGTERM"},
		},
		{
			name:     "-exit N exits at once",
			args:     []string{"-exit", "7"},
			wantCode: 7,
			want:     []string{"main:start", "main:exit"},
		},
		{
			name: "-exit N -after D waits",
			args: []string{"-exit", "3", "-after", "400ms"},
			act: func(t *testing.T, w *localWorkload) {
				// Only a verdict while -after has not elapsed: on a busy
				// machine the start record may be seen later than that.
				// The record times below check the wait itself.
				start := w.records()[0].Mono
				if !w.alive() && time.Duration(MonoNow()-start) < 400*time.Millisecond {
					t.Fatal("exited before -after elapsed")
				}
			},
			wantCode: 3,
			want:     []string{"main:start", "main:exit"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := startLocalWorkload(t, tc.args...)
			if tc.act != nil {
				tc.act(t, w)
			}
			if code := w.exitCode(10 * time.Second); code != tc.wantCode {
				t.Errorf("exit code %d, want %d", code, tc.wantCode)
			}
			recs := w.records()
			if got := events(recs); !slices.Equal(got, tc.want) {
				t.Errorf("events %v, want %v", got, tc.want)
			}
			last := recs[len(recs)-1]
			if last.Event == EventExit && (last.Code == nil || *last.Code != tc.wantCode) {
				t.Errorf("exit record code %v, want %d", last.Code, tc.wantCode)
			}
			if tc.name == "-exit N -after D waits" {
				if d := time.Duration(recs[1].Mono - recs[0].Mono); d < 400*time.Millisecond {
					t.Errorf("exited %s after start, want >= 400ms", d)
				}
			}
		})
	}
}

// TestTestWorkloadArgvAndEnv checks that arguments and the lock environment
// are recorded verbatim. Not parallel: t.Setenv changes the environment of
// the whole test binary.
func TestTestWorkloadArgvAndEnv(t *testing.T) {
	args := []string{"--", "plain", "with space", "ünïcode", `"quoted"`, "", "-notaflag"}
	t.Setenv("NOMAD_ALLOC_ID", "11111111-2222-3333-4444-555555555555")
	t.Setenv("NOMAD_LOCK_FENCE", "1234")
	t.Setenv("NOMAD_LOCK_PATH", "nomad/jobs/x/lock")
	w := startLocalWorkload(t, args...)
	r := w.records()[0]
	if got := r.Argv[len(r.Argv)-len(args):]; !slices.Equal(got, args) {
		t.Errorf("argv tail %q, want %q", got, args)
	}
	if r.AllocID != "11111111-2222-3333-4444-555555555555" || r.Fence != "1234" || r.LockPath != "nomad/jobs/x/lock" {
		t.Errorf("env not recorded: %+v", r)
	}
	if r.PID != w.cmd.Process.Pid || r.PGID != w.cmd.Process.Pid || r.Mono <= 0 || r.Wall.IsZero() {
		t.Errorf("identity not recorded: %+v (pid %d)", r, w.cmd.Process.Pid)
	}
	procs, err := FindProcs(w.marker)
	if err != nil || len(procs) != 1 || procs[0].AllocID != r.AllocID || procs[0].Fence != "1234" || !procs[0].IsMainWorkload() {
		t.Errorf("FindProcs: %v, %v", procs, err)
	}
}

// TestTestWorkloadChildrenAndSampler starts a workload with grandchildren,
// checks FindProcs and the Sampler see them, kills the process group and
// checks that the sampler observed the end.
func TestTestWorkloadChildrenAndSampler(t *testing.T) {
	w := startLocalWorkload(t, "-children", "2")
	deadline := time.Now().Add(10 * time.Second)
	var recs []Record
	for {
		recs = w.records()
		if len(recs) >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := events(recs); !slices.Equal(got, []string{"main:start", "child:start", "child:start"}) {
		t.Fatalf("events %v", got)
	}
	for _, r := range recs {
		if r.PGID != w.cmd.Process.Pid {
			t.Errorf("pid %d in process group %d, want %d", r.PID, r.PGID, w.cmd.Process.Pid)
		}
	}

	procs, err := FindProcs(w.marker)
	if err != nil {
		t.Fatal(err)
	}
	var mains, children int
	for _, p := range procs {
		switch {
		case p.IsMainWorkload():
			mains++
		case p.IsWorkloadChild():
			children++
		}
	}
	if len(procs) != 3 || mains != 1 || children != 2 {
		t.Fatalf("FindProcs: %d procs, %d main, %d children: %v", len(procs), mains, children, procs)
	}

	all := StartSampler(t, SamplerOptions{Marker: w.marker, Interval: 10 * time.Millisecond})
	mainOnly := StartSampler(t, SamplerOptions{Marker: w.marker, Filter: Proc.IsMainWorkload})
	var pids []int
	for _, p := range procs {
		pids = append(pids, p.PID)
	}
	all.WaitSeen(t, 30*time.Second, pids...)
	mainOnly.WaitSeen(t, 30*time.Second, w.cmd.Process.Pid)
	killedAt := MonoNow()
	if err := syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	w.exitCode(10 * time.Second)
	// Children are reparented and reaped by init; wait until they are gone.
	waitGone(t, w.marker, 10*time.Second)
	sumAll, sumMain := all.Stop(), mainOnly.Stop()
	t.Logf("all: %s", sumAll)
	t.Logf("main only: %s", sumMain)

	if sumAll.MaxProcs != 3 || sumAll.MaxAllocs != 3 {
		t.Errorf("all: max %d procs / %d owners, want 3 / 3", sumAll.MaxProcs, sumAll.MaxAllocs)
	}
	if sumMain.MaxProcs != 1 || sumMain.MaxAllocs != 1 || len(sumMain.Over(1)) != 0 {
		t.Errorf("main only: max %d procs / %d owners, want 1 / 1", sumMain.MaxProcs, sumMain.MaxAllocs)
	}
	if len(sumMain.Empty()) == 0 {
		t.Errorf("main only: no empty sample after the kill")
	}
	ivs := Intervals(w.records(), sumMain.GoneByPID())
	if len(ivs) != 1 || !ivs[0].Ended || ivs[0].EndedBy != "observed" || ivs[0].End < killedAt {
		t.Errorf("intervals %+v (killed at %d)", ivs, killedAt)
	}
}

func waitGone(t *testing.T, marker string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		procs, err := FindProcs(marker)
		if err == nil && len(procs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes with marker %s still alive after %s: %v", marker, timeout, procs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTestWorkloadHTTP: -http serves 200 "alloc <NOMAD_ALLOC_ID>" until the
// stop signal, which is recorded as before.
func TestTestWorkloadHTTP(t *testing.T) {
	port := FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	w := startLocalWorkload(t, "-http", addr)
	// The listener is open before the start record is written.
	resp, err := http.Get("http://" + addr + "/anything")
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), "alloc ") {
		t.Errorf("GET answered %d %q, want 200 \"alloc <id>\"", resp.StatusCode, body)
	}
	w.signal(syscall.SIGTERM)
	if code := w.exitCode(10 * time.Second); code != 0 {
		t.Errorf("exit code %d, want 0", code)
	}
	if got := events(w.records()); !slices.Equal(got, []string{"main:start", "main:stop:SIGTERM"}) {
		t.Errorf("events %v", got)
	}
	if _, err := http.Get("http://" + addr + "/"); err == nil {
		t.Error("still serving after the stop")
	}

	// A busy address is a start failure (exit 2), not a silent workload.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	out, err := exec.Command(BuildTestWorkload(t), "-http", ln.Addr().String()).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "listen -http") {
		t.Errorf("busy -http address: err %v, output %q; want exit 2 naming the listen", err, out)
	}
}
