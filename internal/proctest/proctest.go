// Package proctest holds what tests that start long-lived helper processes
// (Nomad agents, HAProxy, the reference LB API) need in common: a fork
// from a thread that never exits, so that Pdeathsig means "when the test
// binary dies", and a buffer that collects a child's output while the test
// reads it.
package proctest

import (
	"bytes"
	"os/exec"
	"runtime"
	"sync"
)

// Pdeathsig fires when the *thread* that forked the child exits, not the
// process, and Go may retire threads: every child is forked from one
// goroutine locked to its thread for the life of the test binary.
var (
	spawnOnce sync.Once
	spawnReqs chan spawnReq
)

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// StartPinned runs cmd.Start on the long-lived pinned thread.
func StartPinned(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnReqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread must outlive its children
			for req := range spawnReqs {
				req.done <- req.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	spawnReqs <- spawnReq{cmd: cmd, done: done}
	return <-done
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers and readers.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
