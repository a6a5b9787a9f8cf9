// Package dockerengine is the small, typed subset of the Docker Engine API
// that a gate needs to kill and prove dead its allocation's docker tasks:
// ping, list containers by label, inspect, pause, kill, over the engine's
// local unix socket.
//
// Why not the official client (github.com/docker/docker/client): the plugin
// is a root process that every task's supervisor re-execs, and it needs five
// calls whose shapes have not changed since API 1.24. The official module
// pulls in the engine's API types, OpenTelemetry and containerd's errdefs,
// adds megabytes to the binary (and to every supervisor's memory), and ties
// our build to its API-version negotiation. Requests here use unversioned
// paths, which every engine answers with its own current version, so an
// engine that has dropped old API versions (Docker 29 refuses < 1.44) still
// answers.
//
// Only unix:// endpoints are accepted: the endpoint is an operator setting
// (the plugin config's docker_endpoint), never a jobspec's, and a TCP engine
// is not the local one that runs this node's containers.
package dockerengine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultEndpoint is Docker's own default socket.
const DefaultEndpoint = "unix:///var/run/docker.sock"

// ErrNotFound is a container the engine does not know (removed).
var ErrNotFound = errors.New("no such container")

// Client talks to one local engine.
type Client struct {
	socket string
	http   *http.Client
}

// New returns a client for a unix:// endpoint.
func New(endpoint string) (*Client, error) {
	socket, err := SocketPath(endpoint)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns:    2,
		IdleConnTimeout: 30 * time.Second,
	}
	return &Client{socket: socket, http: &http.Client{Transport: tr}}, nil
}

// SocketPath checks a unix:// endpoint and returns its socket path.
func SocketPath(endpoint string) (string, error) {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok || !strings.HasPrefix(path, "/") {
		return "", fmt.Errorf("docker endpoint %q: only a local engine's socket is supported, as unix:///absolute/path (default %s)", endpoint, DefaultEndpoint)
	}
	return path, nil
}

// Close drops idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Container is one entry of a container list.
type Container struct {
	ID     string            `json:"Id"`
	Names  []string          `json:"Names"`
	Labels map[string]string `json:"Labels"`
	State  string            `json:"State"`
}

// State is a container's state, from an inspect.
type State struct {
	Status   string `json:"Status"`
	Running  bool   `json:"Running"`
	Paused   bool   `json:"Paused"`
	Pid      int    `json:"Pid"`
	ExitCode int    `json:"ExitCode"`
}

// Inspected is what a gate reads of one container.
type Inspected struct {
	ID     string `json:"Id"`
	Name   string `json:"Name"`
	State  State  `json:"State"`
	Config struct {
		Labels map[string]string `json:"Labels"`
		// StopSignal is the image's STOPSIGNAL ("" for none: SIGTERM).
		StopSignal string `json:"StopSignal"`
	} `json:"Config"`
}

// Ping checks that the engine answers.
func (c *Client) Ping(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/_ping", nil)
}

// ListByLabel lists every container (running or not) that has label
// key=value.
func (c *Client) ListByLabel(ctx context.Context, key, value string) ([]Container, error) {
	filters, _ := json.Marshal(map[string][]string{"label": {key + "=" + value}})
	q := url.Values{"all": {"1"}, "filters": {string(filters)}}
	var out []Container
	if err := c.do(ctx, http.MethodGet, "/containers/json?"+q.Encode(), &out); err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	return out, nil
}

// Inspect reads one container.
func (c *Client) Inspect(ctx context.Context, id string) (Inspected, error) {
	var out Inspected
	err := c.do(ctx, http.MethodGet, "/containers/"+url.PathEscape(id)+"/json", &out)
	return out, err
}

// Pause freezes every process of a running container (the cgroup freezer):
// none runs again until it is unpaused or killed.
func (c *Client) Pause(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, "/containers/"+url.PathEscape(id)+"/pause", nil)
}

// Kill sends signal (e.g. "SIGKILL", or a task's kill_signal) to a
// container's PID 1. SIGKILL of a paused container ends it without running
// any of its code.
func (c *Client) Kill(ctx context.Context, id, signal string) error {
	return c.do(ctx, http.MethodPost, "/containers/"+url.PathEscape(id)+"/kill?signal="+url.QueryEscape(signal), nil)
}

// apiError is the engine's error body.
type apiError struct {
	Message string `json:"message"`
}

func (c *Client) do(ctx context.Context, method, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://docker"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("docker engine at unix://%s: %w", c.socket, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return fmt.Errorf("docker engine at unix://%s: read %s %s: %w", c.socket, method, path, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return ErrNotFound
	}
	if resp.StatusCode/100 != 2 {
		var ae apiError
		_ = json.Unmarshal(body, &ae)
		return &StatusError{Code: resp.StatusCode, Message: ae.Message}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("docker engine: decode %s %s: %w", method, path, err)
	}
	return nil
}

// StatusError is an engine answer other than 2xx and 404.
type StatusError struct {
	Code    int
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("docker engine answered %d: %s", e.Code, e.Message)
}

// IsConflict reports an engine 409: e.g. pausing a container that is not
// running or already paused.
func IsConflict(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == http.StatusConflict
}
