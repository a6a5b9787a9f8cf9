package shim

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/proctest"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/locktest"
)

// A holder of a semaphore's slot learns its slot and its slot's lock path,
// and its stop releases that slot only once the workload is gone.
func TestRunSemaphoreSlotInTheWorkloadEnv(t *testing.T) {
	vars := locktest.NewVars()
	const prefix = "locks/sem"
	// Slot 1 of 2 is held by another allocation: index 3 prefers it.
	other := lockclient.Config{Path: prefix, Timing: locktest.Timing(), Holders: 2, PreferSlot: 1, Holder: lockclient.Holder{AllocID: "other"}}
	ctx, cancel := context.WithTimeout(context.Background(), ceiling)
	defer cancel()
	if _, err := vars.Locker(t, other).Acquire(ctx, lockclient.AcquireOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := lockclient.Config{Path: prefix, Timing: locktest.Timing(), Holders: 2, PreferSlot: 3, Holder: lockclient.Holder{AllocID: "self"}}
	out := &proctest.SyncBuffer{}
	stop := make(chan StopRequest, 1)
	sup := attached(t, &Supervisor{Locker: vars.Locker(t, cfg), Stop: stop},
		Spec{Config: Config{Path: prefix, Holders: 2, AllocIndex: 3,
			Command:    []string{"/bin/sh", "-c", `echo "slot=$NOMAD_LOCK_SLOT path=$NOMAD_LOCK_PATH fence=$NOMAD_LOCK_FENCE"; exec sleep 30`},
			KillSignal: syscall.SIGTERM, KillTimeout: time.Second}},
		Env{Process: Process{Stdout: out, Stderr: out, Env: []string{"PATH=/usr/bin:/bin"}}})
	slot0 := vars.Server(lockclient.SlotPath(prefix, 0))
	code := make(chan int, 1)
	go func() { code <- sup.Run(context.Background(), nil) }()
	deadline := time.Now().Add(ceiling)
	for !strings.Contains(out.String(), "slot=") {
		if time.Now().After(deadline) {
			t.Fatalf("the workload did not start; output %q", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	fence, _ := slot0.LastGrant()
	want := "slot=0 path=" + lockclient.SlotPath(prefix, 0) + " fence=" + strconv.FormatUint(fence, 10)
	if got := strings.TrimSpace(out.String()); got != want {
		t.Errorf("workload env: %q, want %q", got, want)
	}
	stop <- StopRequest{Signal: syscall.SIGTERM, Timeout: time.Second}
	select {
	case <-code:
	case <-time.After(ceiling):
		t.Fatal("the supervisor did not end")
	}
	if slot0.Held() {
		t.Error("slot 0 still held after the stop")
	}
	if !vars.Server(lockclient.SlotPath(prefix, 1)).Held() {
		t.Error("the other allocation's slot 1 was released")
	}
}

// A slot lost to another holder stops the workload as a lost lock does,
// and leaves the other slots alone.
func TestRunSemaphoreSlotLostStopsTheWorkload(t *testing.T) {
	vars := locktest.NewVars()
	const prefix = "locks/sem"
	cfg := lockclient.Config{Path: prefix, Timing: locktest.Timing(), Holders: 2, Holder: lockclient.Holder{AllocID: "self"}}
	out := &proctest.SyncBuffer{}
	sup := attached(t, &Supervisor{Locker: vars.Locker(t, cfg)},
		Spec{Config: Config{Path: prefix, Holders: 2,
			Command:    []string{"/bin/sh", "-c", `echo "slot=$NOMAD_LOCK_SLOT"; exec sleep 30`},
			KillSignal: syscall.SIGTERM, KillTimeout: time.Second}},
		Env{Process: Process{Stdout: out, Stderr: out, Env: []string{"PATH=/usr/bin:/bin"}}})
	code := make(chan int, 1)
	go func() { code <- sup.Run(context.Background(), nil) }()
	deadline := time.Now().Add(ceiling)
	for !strings.Contains(out.String(), "slot=0") {
		if time.Now().After(deadline) {
			t.Fatalf("the workload did not start on slot 0; output %q", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	vars.Server(lockclient.SlotPath(prefix, 0)).TakeOver(100 * time.Millisecond)
	select {
	case c := <-code:
		if c != ExitLost {
			t.Errorf("exit code %d, want %d (lock lost)", c, ExitLost)
		}
	case <-time.After(ceiling):
		t.Fatal("the supervisor did not stop its workload after its slot was taken")
	}
	if n := vars.Server(lockclient.SlotPath(prefix, 1)).Calls(locktest.OpAcquire); n != 0 {
		t.Errorf("%d acquires of slot 1, want none: slot 0 was free", n)
	}
}
