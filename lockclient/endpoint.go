package lockclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"golang.org/x/sys/unix"
)

// Endpoint is where and as whom the lease talks to Nomad.
type Endpoint struct {
	// Address is "unix:///abs/path/api.sock" for the Task API, or an http(s) URL.
	Address string
	// Token is the workload-identity (or ACL) token. It is never logged.
	Token string
	// TaskAPI is true when Address is the task's api.sock.
	TaskAPI bool
	// RootPeer requires the socket's server to run as root (SO_PEERCRED):
	// for a root caller in a task it does not trust, where the task user
	// could put a socket of its own in place of api.sock and play Nomad.
	RootPeer bool
	// Peer, if set (with RootPeer), must accept the socket server's PID
	// before any request is sent: the plugin sends the operator's release
	// token only to the Nomad agent itself, never to whatever a task user
	// put in place of its api.sock.
	Peer func(pid int32) error
	// TLS and Region, if set, are those of Nomad's CLI for an http(s)
	// Address outside a task (its flags over its NOMAD_* variables).
	TLS    *api.TLSConfig
	Region string
}

// String describes the endpoint without the token.
func (e Endpoint) String() string {
	if e.TaskAPI {
		return "Task API " + e.Address
	}
	return e.Address
}

// Client is a Nomad API client of the endpoint, in namespace ("" for the
// token's default).
func (e Endpoint) Client(namespace string) (*api.Client, error) {
	ac := api.DefaultConfig()
	ac.Address = e.Address
	ac.SecretID = e.Token
	if e.RootPeer {
		ac.HttpClient = rootPeerClient(strings.TrimPrefix(e.Address, "unix://"), e.Peer)
	}
	if e.TLS != nil {
		ac.TLSConfig = e.TLS.Copy()
	}
	if e.Region != "" {
		ac.Region = e.Region
	}
	if namespace != "" {
		ac.Namespace = namespace
	}
	client, err := api.NewClient(ac)
	if err != nil {
		return nil, fmt.Errorf("nomad client for %s: %w", e, err)
	}
	return client, nil
}

// ErrNoEndpoint means neither a Task API socket nor NOMAD_ADDR was found.
var ErrNoEndpoint = errors.New(
	"no Nomad Task API socket found (NOMAD_UNIX_ADDR unset and no $NOMAD_SECRETS_DIR/api.sock): " +
		"add `identity { env = true }` to the task, or set NOMAD_ADDR when running outside Nomad")

// ErrNoToken means the Task API socket exists but no token was given to reach it.
var ErrNoToken = errors.New(
	"no workload identity token (NOMAD_TOKEN unset and no $NOMAD_SECRETS_DIR/nomad_token): " +
		"add `identity { env = true }` (or `identity { file = true }`) to the task")

// DiscoverEndpoint finds the Nomad API the way a task sees it. The socket is
// NOMAD_UNIX_ADDR, else $NOMAD_SECRETS_DIR/api.sock; NOMAD_ADDR is the
// fallback for use outside a task. The token is NOMAD_TOKEN, else
// $NOMAD_SECRETS_DIR/nomad_token. getenv is os.Getenv in production.
func DiscoverEndpoint(getenv func(string) string) (Endpoint, error) {
	secrets := getenv("NOMAD_SECRETS_DIR")
	token, err := discoverToken(getenv, secrets)
	if err != nil {
		return Endpoint{}, err
	}

	if addr := getenv("NOMAD_UNIX_ADDR"); addr != "" {
		if !strings.HasPrefix(addr, "unix://") {
			addr = "unix://" + addr
		}
		return taskAPIEndpoint(addr, token)
	}
	if secrets != "" {
		sock := filepath.Join(secrets, "api.sock")
		if _, err := os.Stat(sock); err == nil {
			abs, err := filepath.Abs(sock)
			if err != nil {
				return Endpoint{}, fmt.Errorf("resolve %s: %w", sock, err)
			}
			return taskAPIEndpoint("unix://"+abs, token)
		}
	}
	if addr := getenv("NOMAD_ADDR"); addr != "" {
		return Endpoint{Address: addr, Token: token}, nil
	}
	return Endpoint{}, ErrNoEndpoint
}

// DiscoverRootEndpoint is DiscoverEndpoint for a caller that runs as root
// beside a task it does not trust (the driver's plugin and supervisor). The
// socket is <secretsDir>/api.sock, where secretsDir comes from the caller,
// never from the task environment (a job can set NOMAD_UNIX_ADDR or
// NOMAD_SECRETS_DIR in its env block), and it must be served by root. The
// token is NOMAD_TOKEN, else secretsDir/nomad_token read as a regular file,
// never through a symlink, a FIFO or a hard link (the task user can write
// the secrets dir).
func DiscoverRootEndpoint(secretsDir string, getenv func(string) string) (Endpoint, error) {
	if secretsDir == "" {
		return Endpoint{}, ErrNoEndpoint
	}
	token := strings.TrimSpace(getenv("NOMAD_TOKEN"))
	if token == "" {
		b, err := securefs.ReadBeneath(secretsDir, "nomad_token", maxTokenBytes)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return Endpoint{}, fmt.Errorf("read workload identity token in %s: %w", secretsDir, err)
		}
		token = strings.TrimSpace(string(b))
	}
	ep, err := taskAPIEndpoint("unix://"+filepath.Join(secretsDir, "api.sock"), token)
	ep.RootPeer = true
	return ep, err
}

// maxTokenBytes bounds a workload identity token file.
const maxTokenBytes = 64 << 10

func taskAPIEndpoint(addr, token string) (Endpoint, error) {
	if token == "" {
		return Endpoint{}, ErrNoToken
	}
	return Endpoint{Address: addr, Token: token, TaskAPI: true}, nil
}

func discoverToken(getenv func(string) string, secrets string) (string, error) {
	if t := strings.TrimSpace(getenv("NOMAD_TOKEN")); t != "" {
		return t, nil
	}
	if secrets == "" {
		return "", nil
	}
	path := filepath.Join(secrets, "nomad_token")
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("read workload identity token %s: %w "+
			"(the supervisor must run as the task user that owns the secrets dir)", path, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// ErrNotRootPeer means the Task API socket is served by a process that is
// not root: not the Nomad agent.
var ErrNotRootPeer = errors.New("the Task API socket is not served by root, so it is not the Nomad agent's")

// rootPeerClient is an HTTP client for the socket at path that refuses any
// connection whose server does not run as root.
func rootPeerClient(path string, peer func(pid int32) error) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			conn, err := dialer.DialContext(ctx, "unix", path)
			if err != nil {
				return nil, err
			}
			if err := checkRootPeer(conn, peer); err != nil {
				conn.Close()
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			return conn, nil
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
	}}
}

func checkRootPeer(conn net.Conn, peer func(pid int32) error) error {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return errors.New("not a unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if credErr != nil {
		return fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	if cred.Uid != 0 {
		return fmt.Errorf("%w (peer uid %d, pid %d)", ErrNotRootPeer, cred.Uid, cred.Pid)
	}
	if peer != nil {
		return peer(cred.Pid)
	}
	return nil
}
