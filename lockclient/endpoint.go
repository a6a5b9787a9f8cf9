package lockclient

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Endpoint is where and as whom the lease talks to Nomad.
type Endpoint struct {
	// Address is "unix:///abs/path/api.sock" for the Task API, or an http(s) URL.
	Address string
	// Token is the workload-identity (or ACL) token. It is never logged.
	Token string
	// TaskAPI is true when Address is the task's api.sock.
	TaskAPI bool
}

// String describes the endpoint without the token.
func (e Endpoint) String() string {
	if e.TaskAPI {
		return "Task API " + e.Address
	}
	return e.Address
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
