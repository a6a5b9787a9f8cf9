package lockclient

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A root caller talks to the Task API socket only if root serves it: the
// task user can put a socket of its own where api.sock was.
func TestRootPeerClientRefusesOtherServers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a socket server as another user")
	}
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(base, "secrets")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}

	// Served by root (this test): accepted.
	rootSock := filepath.Join(dir, "root.sock")
	ln, err := net.Listen("unix", rootSock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { _ = http.Serve(ln, okHandler) }()
	if resp, err := rootPeerClient(rootSock, nil).Get("http://127.0.0.1/"); err != nil {
		t.Fatalf("a socket served by root: %v", err)
	} else {
		resp.Body.Close()
	}

	// With a peer check (the operator's token goes to the agent alone): the
	// check sees the server's PID, and its refusal stops the request.
	var seen int32
	onlySelf := func(pid int32) error {
		seen = pid
		if pid != int32(os.Getpid()) {
			return errors.New("not us")
		}
		return nil
	}
	if resp, err := rootPeerClient(rootSock, onlySelf).Get("http://127.0.0.1/"); err != nil || seen != int32(os.Getpid()) {
		t.Fatalf("a root socket the peer check accepts: err %v, peer pid %d, want %d", err, seen, os.Getpid())
	} else {
		resp.Body.Close()
	}
	errOther := errors.New("not the agent")
	if _, err := rootPeerClient(rootSock, func(int32) error { return errOther }).Get("http://127.0.0.1/"); !errors.Is(err, errOther) {
		t.Fatalf("a root socket the peer check refuses: err = %v, want the check's error", err)
	}

	// Served by nobody: refused before anything is sent.
	fake := filepath.Join(dir, "api.sock")
	// This test binary, copied where nobody can run it, serves the socket.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "fake-nomad")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	srv := exec.Command(bin, "-test.run", "^$")
	srv.Env = []string{fakeServerEnv + "=" + fake}
	srv.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	ready := make(chan error, 1)
	go func() { b := make([]byte, 6); _, err := io.ReadFull(out, b); ready <- err }()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the fake server did not start")
	}
	_, err = rootPeerClient(fake, nil).Get("http://127.0.0.1/")
	if !errors.Is(err, ErrNotRootPeer) {
		t.Fatalf("a socket served by nobody: err = %v, want ErrNotRootPeer", err)
	}
}

// fakeServerEnv makes the test binary a socket server that answers every
// request 200 (see TestMain).
const fakeServerEnv = "LOCKCLIENT_TEST_FAKE_SERVER"

// okHandler answers every request 200 "ok".
var okHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })

func TestMain(m *testing.M) {
	if path := os.Getenv(fakeServerEnv); path != "" {
		ln, err := net.Listen("unix", path)
		if err != nil {
			os.Exit(2)
		}
		os.Stdout.WriteString("ready\n")
		_ = http.Serve(ln, okHandler)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// DiscoverRootEndpoint never reads the token through a symlink a task user
// planted in its secrets dir.
func TestDiscoverRootEndpointRefusesTokenSymlink(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(t.TempDir(), "root-only")
	if err := os.WriteFile(secret, []byte("not-a-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, "nomad_token")); err != nil {
		t.Fatal(err)
	}
	// A job can set these in its env block: they must not move the socket.
	env := map[string]string{"NOMAD_SECRETS_DIR": "/elsewhere", "NOMAD_UNIX_ADDR": "/run/docker.sock"}
	ep, err := DiscoverRootEndpoint(dir, func(k string) string { return env[k] })
	if err == nil || ep.Token != "" {
		t.Fatalf("DiscoverRootEndpoint followed a symlinked token file: %+v, %v", ep, err)
	}
	env["NOMAD_TOKEN"] = "t0ken"
	ep, err = DiscoverRootEndpoint(dir, func(k string) string { return env[k] })
	if err != nil || ep.Token != "t0ken" || !ep.RootPeer || ep.Address != "unix://"+filepath.Join(dir, "api.sock") {
		t.Fatalf("with NOMAD_TOKEN: %+v, %v", ep, err)
	}
}
