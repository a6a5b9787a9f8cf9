package haproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// DefaultTimeout bounds one Runtime API command when Client.Timeout is 0.
const DefaultTimeout = 2 * time.Second

// Client runs Runtime API commands on HAProxy's admin stats socket
// (`stats socket <path> level admin`), one connection per command. It is
// safe for concurrent use; HAProxy runs each command atomically.
type Client struct {
	// Socket is the path of the stats socket.
	Socket string
	// Timeout bounds each command (default DefaultTimeout), within the
	// caller's context.
	Timeout time.Duration
}

// CommandError is HAProxy refusing a command: Answer is what it said, e.g.
// "No such backend." or "Only servers in maintenance mode can be deleted.".
type CommandError struct {
	Command string
	Answer  string
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("haproxy refused %q: %s", e.Command, e.Answer)
}

// Command sends one command and returns HAProxy's answer with surrounding
// whitespace trimmed. An error means the socket could not be reached or the
// answer not read; what HAProxy answered is for the caller to judge.
func (c *Client) Command(ctx context.Context, cmd string) (string, error) {
	if strings.ContainsAny(cmd, ";\n\r") {
		// ';' separates commands on one line: never let a value add one.
		return "", fmt.Errorf("haproxy: command %q contains ';' or a line break", cmd)
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.Socket)
	if err != nil {
		return "", fmt.Errorf("haproxy socket %s: %w", c.Socket, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	// Close the connection if ctx ends first (a deadline covers timeouts;
	// this covers cancellation).
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := io.WriteString(conn, cmd+"\n"); err != nil {
		return "", fmt.Errorf("haproxy socket %s: send %q: %w", c.Socket, cmd, err)
	}
	// Outside interactive mode HAProxy closes the connection after the answer.
	out, err := io.ReadAll(io.LimitReader(conn, 16<<20))
	if err != nil {
		return "", fmt.Errorf("haproxy socket %s: read the answer to %q: %w", c.Socket, cmd, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// expect runs cmd and returns a *CommandError unless the answer is want
// ("" for commands that answer nothing on success).
func (c *Client) expect(ctx context.Context, cmd, want string) error {
	out, err := c.Command(ctx, cmd)
	if err != nil {
		return err
	}
	if out != want {
		return &CommandError{Command: cmd, Answer: out}
	}
	return nil
}

// AddServer adds a dynamic server to backend, in maintenance (enable it with
// EnableServer). args are extra server keywords, e.g. "maxconn", "100".
func (c *Client) AddServer(ctx context.Context, backend, server, addr string, args ...string) error {
	for _, v := range append([]string{backend, server, addr}, args...) {
		if v == "" || strings.ContainsAny(v, " \t") {
			return fmt.Errorf("haproxy: add server: %q is empty or has a space", v)
		}
	}
	cmd := strings.Join(append([]string{"add server", backend + "/" + server, addr}, args...), " ")
	return c.expect(ctx, cmd, "New server registered.")
}

// EnableServer takes a server out of maintenance.
func (c *Client) EnableServer(ctx context.Context, backend, server string) error {
	return c.expect(ctx, "enable server "+backend+"/"+server, "")
}

// SetMaint puts a server in maintenance: it gets no new traffic.
func (c *Client) SetMaint(ctx context.Context, backend, server string) error {
	return c.expect(ctx, "set server "+backend+"/"+server+" state maint", "")
}

// ShutdownSessions closes every stream on a server.
func (c *Client) ShutdownSessions(ctx context.Context, backend, server string) error {
	return c.expect(ctx, "shutdown sessions server "+backend+"/"+server, "")
}

// DelServer deletes a server, which must be in maintenance and have no
// connection left.
func (c *Client) DelServer(ctx context.Context, backend, server string) error {
	return c.expect(ctx, "del server "+backend+"/"+server, "Server deleted.")
}

// ServersState reads `show servers state <backend>`.
func (c *Client) ServersState(ctx context.Context, backend string) ([]ServerState, error) {
	cmd := "show servers state " + backend
	out, err := c.Command(ctx, cmd)
	if err != nil {
		return nil, err
	}
	states, err := ParseServersState(out)
	if err != nil {
		var pe *ParseError
		if errors.As(err, &pe) && !strings.HasPrefix(out, "1\n") && out != "1" {
			// Not a state dump at all: HAProxy's refusal, e.g. "Can't find backend."
			return nil, &CommandError{Command: cmd, Answer: out}
		}
		return nil, fmt.Errorf("haproxy: %s: %w", cmd, err)
	}
	return states, nil
}

// Info reads `show info` as a map, e.g. "Version" → "2.6.12-1+deb12u3".
func (c *Client) Info(ctx context.Context) (map[string]string, error) {
	out, err := c.Command(ctx, "show info")
	if err != nil {
		return nil, err
	}
	info := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			info[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	if info["Version"] == "" {
		return nil, &CommandError{Command: "show info", Answer: out}
	}
	return info, nil
}
