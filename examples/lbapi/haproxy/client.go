package haproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
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
// "No such server.".
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

// SetAddr points a server at ip:port. Only do it to a server that has no
// stream (see Loads): a stream assigned to it would connect to the new
// address on a retry.
func (c *Client) SetAddr(ctx context.Context, backend, server, ip string, port int) error {
	if net.ParseIP(ip) == nil || port < 1 || port > 65535 {
		return fmt.Errorf("haproxy: set server addr: %q port %d is not an IP address and port", ip, port)
	}
	cmd := fmt.Sprintf("set server %s/%s addr %s port %d", backend, server, ip, port)
	out, err := c.Command(ctx, cmd)
	if err != nil {
		return err
	}
	// "IP changed from … to …, port changed from …", or "no need to change
	// the addr, …" when it already was.
	if !strings.Contains(out, "changed") && !strings.Contains(out, "no need to change") {
		return &CommandError{Command: cmd, Answer: out}
	}
	return nil
}

// SetReady takes a server out of maintenance and drain: it gets traffic.
func (c *Client) SetReady(ctx context.Context, backend, server string) error {
	return c.expect(ctx, "set server "+backend+"/"+server+" state ready", "")
}

// SetMaint puts a server in maintenance: it gets no new traffic, its queue
// goes back to the backend, and the streams it has run to their end.
func (c *Client) SetMaint(ctx context.Context, backend, server string) error {
	return c.expect(ctx, "set server "+backend+"/"+server+" state maint", "")
}

// Load is what a server is busy with, from `show stat`.
type Load struct {
	// Sessions is scur: the streams assigned to the server, including those
	// still connecting or retrying.
	Sessions int
	// Queued is qcur: streams waiting for a connection slot on it.
	Queued int
}

// Idle reports a server that no stream refers to.
func (l Load) Idle() bool { return l.Sessions == 0 && l.Queued == 0 }

// Loads reads the servers' loads of backend from `show stat`, by server
// name.
func (c *Client) Loads(ctx context.Context, backend string) (map[string]Load, error) {
	cmd := "show stat " + backend + " 4 -1" // type 4: servers only
	out, err := c.Command(ctx, cmd)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "# ") {
		return nil, &CommandError{Command: cmd, Answer: out}
	}
	cols := map[string]int{}
	for i, name := range strings.Split(strings.TrimPrefix(lines[0], "# "), ",") {
		cols[name] = i
	}
	for _, need := range []string{"pxname", "svname", "scur", "qcur"} {
		if _, ok := cols[need]; !ok {
			return nil, fmt.Errorf("haproxy: %s: header lacks column %s", cmd, need)
		}
	}
	loads := map[string]Load{}
	for _, line := range lines[1:] {
		f := strings.Split(strings.TrimSpace(line), ",")
		if len(f) < len(cols) || f[cols["pxname"]] != backend {
			continue
		}
		var l Load
		var e1, e2 error
		l.Sessions, e1 = strconv.Atoi(f[cols["scur"]])
		l.Queued, e2 = strconv.Atoi(f[cols["qcur"]])
		if err := errors.Join(e1, e2); err != nil {
			return nil, fmt.Errorf("haproxy: %s: server %s: %w", cmd, f[cols["svname"]], err)
		}
		loads[f[cols["svname"]]] = l
	}
	return loads, nil
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
