// Package chans holds the one channel idiom the project repeats: asking,
// without blocking, whether a done-style channel has been closed.
package chans

// Closed reports, without blocking, whether ch is closed. It is meant for
// channels that are only ever closed, never sent on (done, lost, exited):
// on such a channel a successful receive means closed. A value sent on ch
// would be consumed and reported as closed.
func Closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
