// Package haproxytest runs a real HAProxy for tests, the way net/http/httptest
// runs an HTTP server: Start writes a configuration with one frontend on a
// free loopback port, one backend per service and an admin socket in a fresh
// temporary directory, starts HAProxy as a child process, and stops it (by
// its PID) and removes the directory at cleanup.
//
// HAProxy must be installed (Debian: apt-get install -y haproxy; `make test`
// installs it through .ci/run). A test that needs it fails when it is
// missing, so that a machine without it cannot pass by skipping the
// feature, unless SINGLETON_E2E_NO_HAPROXY=1 says to skip.
package haproxytest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi/haproxy"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/proctest"
)

// EnvSkip, set to 1, makes tests that need HAProxy skip when it is not
// installed instead of failing.
const EnvSkip = "SINGLETON_E2E_NO_HAPROXY"

// Binary returns the haproxy executable. If there is none, it fails the
// test, or skips it when EnvSkip is 1.
func Binary(t testing.TB) string {
	t.Helper()
	bin, err := haproxy.Binary()
	if err == nil {
		return bin
	}
	if os.Getenv(EnvSkip) == "1" {
		t.Skipf("%v; skipped because %s=1", err, EnvSkip)
	}
	t.Fatalf("%v; install it (make test does, through .ci/run), or set %s=1 to skip the tests that need it", err, EnvSkip)
	return ""
}

// Options configure Start.
type Options struct {
	// Services get one backend each; the first is also the default backend.
	Services []haproxy.Service
	// Slots is the number of server slots per backend (default
	// haproxy.DefaultSlots).
	Slots int
	// Spawn and SysProcAttr are passed to haproxy.ProcessOptions. By
	// default HAProxy is forked from a thread that lives as long as the test
	// binary, with Pdeathsig SIGKILL, so that it dies with the test binary
	// even when a timeout kills that before cleanup runs.
	Spawn       func(*exec.Cmd) error
	SysProcAttr *syscall.SysProcAttr
}

// Instance is a running HAProxy.
type Instance struct {
	*haproxy.Process
	// Config is the configuration it runs with.
	Config haproxy.Config
	// Client talks to its admin socket.
	Client *haproxy.Client
	// URL is the frontend, e.g. http://127.0.0.1:41234.
	URL string
	// Dir holds the configuration, the socket and the log.
	Dir string

	log *proctest.SyncBuffer
}

// Start runs HAProxy with a generated configuration (see the package doc).
func Start(t testing.TB, opts Options) *Instance {
	t.Helper()
	bin := Binary(t)
	// Not t.TempDir(): a unix socket path must stay under 108 bytes, and
	// test names make those long.
	dir, err := os.MkdirTemp("", "haproxy-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg := haproxy.Config{
		Socket:   filepath.Join(dir, "admin.sock"),
		Bind:     fmt.Sprintf("127.0.0.1:%d", port),
		Services: opts.Services,
		Slots:    opts.Slots,
	}
	cfgPath := filepath.Join(dir, "haproxy.cfg")
	if err := cfg.Write(cfgPath); err != nil {
		t.Fatal(err)
	}
	inst := &Instance{
		Config: cfg, Client: &haproxy.Client{Socket: cfg.Socket}, URL: "http://" + cfg.Bind, Dir: dir,
		log: &proctest.SyncBuffer{},
	}
	if opts.Spawn == nil {
		opts.Spawn = proctest.StartPinned
		if opts.SysProcAttr == nil {
			opts.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		}
	}
	p, err := haproxy.StartProcess(haproxy.ProcessOptions{
		Bin: bin, Config: cfgPath, Socket: cfg.Socket, Log: inst.log,
		Spawn: opts.Spawn, SysProcAttr: opts.SysProcAttr,
	})
	if err != nil {
		t.Fatalf("haproxytest: %v", err)
	}
	inst.Process = p
	t.Cleanup(func() {
		if err := p.Stop(2 * time.Second); err != nil {
			t.Errorf("haproxytest: %v", err)
		}
		if t.Failed() {
			t.Logf("haproxytest: HAProxy's configuration (%s):\n%s\nits log:\n%s", cfgPath, readFile(cfgPath), inst.Log())
		}
	})
	return inst
}

// Restart kills HAProxy and starts it again with the same configuration: it
// comes back with no server that was added at run time.
func (i *Instance) Restart(t testing.TB) {
	t.Helper()
	if err := i.Process.Restart(2 * time.Second); err != nil {
		t.Fatalf("haproxytest: restart: %v", err)
	}
}

// Servers reads `show servers state` of a backend.
func (i *Instance) Servers(t testing.TB, backend string) []haproxy.ServerState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := i.Client.ServersState(ctx, backend)
	if err != nil {
		t.Fatalf("haproxytest: %v", err)
	}
	return st
}

// Log is what HAProxy wrote to stdout and stderr.
func (i *Instance) Log() string { return i.log.String() }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func readFile(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return err.Error()
	}
	return string(b)
}
