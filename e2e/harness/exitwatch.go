package harness

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ExitWatch reports the moment a process exits, through a pidfd: poll(2)
// wakes on the exit itself, so the time is exact to a thread wake-up, where
// a /proc scan can only bound it by the scan's end (tens of ms on a busy
// machine). Open it while the process lives, e.g. before killing it.
type ExitWatch struct {
	PID  int
	done chan struct{} // closed once the exit was seen or the watch closed
	stop chan struct{}
	once sync.Once
	at   int64 // CLOCK_MONOTONIC ns of the exit; 0 if not seen
}

// WatchExit opens a pidfd on pid and watches it until it exits or Close.
// It fails (ESRCH) if the process is already gone.
func WatchExit(pid int) (*ExitWatch, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	w := &ExitWatch{PID: pid, done: make(chan struct{}), stop: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer unix.Close(fd)
		// A thread of its own at real-time priority: on a busy machine a
		// normal thread may wake tens of ms after the exit, and a late
		// timestamp makes a clean handover look like an overlap. The thread
		// ends with the goroutine (never unlocked). Without the privilege
		// the watch keeps normal priority.
		runtime.LockOSThread()
		_ = unix.SchedSetAttr(0, &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: 10}, 0)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			// A bounded poll, so that Close ends the goroutine soon.
			n, err := unix.Poll(fds, 200)
			if n > 0 {
				w.at = MonoNow()
				return
			}
			if err != nil && !errors.Is(err, unix.EINTR) {
				return
			}
			select {
			case <-w.stop:
				return
			default:
			}
		}
	}()
	return w, nil
}

// Wait waits up to timeout for the exit and returns when it happened.
func (w *ExitWatch) Wait(timeout time.Duration) (int64, bool) {
	select {
	case <-w.done:
	case <-time.After(timeout):
		return 0, false
	}
	return w.at, w.at != 0
}

// Exited returns the exit time if the exit has been seen.
func (w *ExitWatch) Exited() (int64, bool) {
	select {
	case <-w.done:
		return w.at, w.at != 0
	default:
		return 0, false
	}
}

// Close stops watching and waits for the watcher to end.
func (w *ExitWatch) Close() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}
