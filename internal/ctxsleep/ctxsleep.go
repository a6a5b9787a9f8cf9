// Package ctxsleep is a sleep that a context can cut short, shared by the
// lease client, the LB client and the supervisor's health checks.
package ctxsleep

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx ends, whichever comes first, and returns
// ctx.Err() in the second case. A d of zero or less returns at once.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
