package harness

import (
	"testing"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
)

// LB is the reference LB API (examples/lbapi) serving on a free loopback
// port inside the test process, for the load balancer tests.
type LB struct {
	*lbapi.Server
	// Base is the server's base URL, e.g. http://127.0.0.1:41234.
	Base string
	// URI is the request collection: a load_balancer block's uri.
	URI string
}

// StartLB starts an lbapi server on 127.0.0.1:0 and closes it at cleanup.
// Unless opts.Clock is set, it stamps requests with MonoNow, so that
// RequestRecord.Enqueued and Finished compare with the testworkload records
// and sampler timestamps.
func StartLB(t testing.TB, opts lbapi.Options) *LB {
	t.Helper()
	if opts.Clock == nil {
		opts.Clock = MonoNow
	}
	srv, err := lbapi.NewServer(opts)
	if err != nil {
		t.Fatalf("harness: lbapi server: %v", err)
	}
	base, err := srv.Start("127.0.0.1:0")
	if err != nil {
		_ = srv.Close()
		t.Fatalf("harness: lbapi server: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Logf("harness: close lbapi server: %v", err)
		}
	})
	return &LB{Server: srv, Base: base, URI: srv.RequestURL(base)}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ports, err := freePorts(1)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	return ports[0]
}
