package shim

import (
	"context"
	"sync"
	"time"
)

// anyClosed returns a channel closed once any of chs is (nil for none),
// until ctx ends.
func anyClosed(ctx context.Context, chs ...<-chan struct{}) <-chan struct{} {
	switch len(chs) {
	case 0:
		return nil
	case 1:
		return chs[0]
	}
	out := make(chan struct{})
	var once sync.Once
	for _, c := range chs {
		go func() {
			select {
			case <-c:
				once.Do(func() { close(out) })
			case <-ctx.Done():
			}
		}()
	}
	return out
}

// earliest is the earlier of two times.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
