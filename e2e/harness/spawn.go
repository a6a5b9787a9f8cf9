package harness

import (
	"os/exec"
	"runtime"
	"sync"
)

// Processes started with Pdeathsig get that signal when the *thread* that
// forked them exits, not when the process does. Go may retire threads, so
// all such processes are started from one goroutine that stays locked to its
// thread for the life of the test binary.
var (
	spawnOnce sync.Once
	spawnReqs chan spawnReq
)

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// startPinned runs cmd.Start on the long-lived pinned thread.
func startPinned(cmd *exec.Cmd) error {
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
