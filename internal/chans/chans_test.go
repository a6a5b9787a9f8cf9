package chans

import "testing"

func TestClosed(t *testing.T) {
	ch := make(chan struct{})
	if Closed(ch) {
		t.Fatal("open channel reported closed")
	}
	close(ch)
	if !Closed(ch) || !Closed(ch) {
		t.Fatal("closed channel reported open (it must stay closed on every ask)")
	}
	var nilCh chan struct{}
	if Closed(nilCh) {
		t.Fatal("nil channel reported closed (a nil channel is never ready)")
	}
}
