package ctxsleep

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name    string
		ctx     context.Context
		d       time.Duration
		wantErr error
		atLeast time.Duration
	}{
		{"waits the duration", context.Background(), 30 * time.Millisecond, nil, 30 * time.Millisecond},
		{"zero returns at once", context.Background(), 0, nil, 0},
		{"an ended context cuts it short", ended, time.Hour, context.Canceled, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			began := time.Now()
			err := Sleep(tc.ctx, tc.d)
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("Sleep = %v, want %v", err, tc.wantErr)
			}
			if took := time.Since(began); took < tc.atLeast || took > tc.atLeast+10*time.Second {
				t.Errorf("Sleep took %s, want at least %s", took, tc.atLeast)
			}
		})
	}
}
