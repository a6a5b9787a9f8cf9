package shim

import (
	"context"
	"testing"
	"time"
)

// anyClosed closes its channel once, however many of its inputs close
// together: two hooks that end the wait at the same moment must not
// panic the supervisor.
func TestAnyClosedManyAtOnce(t *testing.T) {
	for range 3000 {
		ins := make([]chan struct{}, 8)
		chs := make([]<-chan struct{}, len(ins))
		for i := range ins {
			ins[i] = make(chan struct{})
			chs[i] = ins[i]
		}
		out := anyClosed(context.Background(), chs...)
		for _, c := range ins {
			close(c)
		}
		select {
		case <-out:
		case <-time.After(10 * time.Second):
			t.Fatal("anyClosed did not close when its inputs did")
		}
	}
}
