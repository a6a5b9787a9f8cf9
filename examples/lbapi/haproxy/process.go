package haproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Binary finds the haproxy executable: on PATH, else where Debian's package
// puts it (/usr/sbin, often missing from a non-root PATH).
func Binary() (string, error) {
	if p, err := exec.LookPath("haproxy"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/haproxy", "/usr/local/sbin/haproxy"} {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("haproxy not installed (apt-get install -y haproxy)")
}

// Process is an HAProxy run in the foreground (-db) as our child, so that it
// is stopped by its PID and nothing else.
type Process struct {
	opts ProcessOptions

	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	err  error // from Wait, once done is closed
}

// ProcessOptions say how to run HAProxy.
type ProcessOptions struct {
	// Bin is the haproxy executable (see Binary).
	Bin string
	// Config is the configuration file.
	Config string
	// Socket is the admin socket the configuration declares: HAProxy counts
	// as started once it answers there.
	Socket string
	// Log receives HAProxy's stdout and stderr (nil: discarded).
	Log io.Writer
	// Timeout bounds the start (default 10s).
	Timeout time.Duration
	// Spawn starts the command (default cmd.Start); tests use it to fork from
	// a thread that lives as long as they do, for Pdeathsig.
	Spawn func(*exec.Cmd) error
	// SysProcAttr, if set, is used for the process (Setpgid is always set).
	SysProcAttr *syscall.SysProcAttr
}

// StartProcess checks the configuration file (haproxy -c), starts HAProxy
// with it and waits until its admin socket answers.
func StartProcess(opts ProcessOptions) (*Process, error) {
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.Spawn == nil {
		opts.Spawn = (*exec.Cmd).Start
	}
	p := &Process{opts: opts}
	if err := p.start(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Process) start() error {
	o := p.opts
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, o.Bin, "-c", "-q", "-f", o.Config).CombinedOutput(); err != nil {
		return fmt.Errorf("haproxy -c -f %s: %v: %s", o.Config, err, bytes.TrimSpace(out))
	}
	var stderr tail
	cmd := exec.Command(o.Bin, "-db", "-f", o.Config)
	cmd.Stdout, cmd.Stderr = o.Log, io.MultiWriter(o.Log, &stderr)
	attr := syscall.SysProcAttr{}
	if o.SysProcAttr != nil {
		attr = *o.SysProcAttr
	}
	// Its own process group: a Ctrl-C meant for a demo script reaches the
	// script, which then stops HAProxy by PID.
	attr.Setpgid = true
	cmd.SysProcAttr = &attr
	if err := o.Spawn(cmd); err != nil {
		return fmt.Errorf("start %s: %w", o.Bin, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.err = cmd, done, nil
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	c := &Client{Socket: o.Socket, Timeout: 500 * time.Millisecond}
	for {
		if _, err := c.Info(ctx); err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("haproxy exited at start (%v): %s", p.waitErr(), stderr.String())
		case <-ctx.Done():
			_ = p.Stop(2 * time.Second)
			return fmt.Errorf("haproxy's admin socket %s did not answer within %s: %s", o.Socket, o.Timeout, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (p *Process) waitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// PID is the running HAProxy's process ID.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// Done is closed when the current HAProxy process has exited.
func (p *Process) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Stop ends HAProxy: SIGTERM (its hard stop), then SIGKILL if it has not
// exited within grace. It waits for the exit and is idempotent.
func (p *Process) Stop(grace time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		return nil
	case <-time.After(grace):
	}
	_ = cmd.Process.Kill()
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("haproxy pid %d still running 10s after SIGKILL", cmd.Process.Pid)
	}
}

// Restart stops HAProxy and starts it again with the same configuration:
// it comes back without any server added at run time.
func (p *Process) Restart(grace time.Duration) error {
	if err := p.Stop(grace); err != nil {
		return err
	}
	return p.start()
}

// tail keeps the last 2 KiB written, for error messages.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if len(t.buf) > 2048 {
		t.buf = t.buf[len(t.buf)-2048:]
	}
	return len(b), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}
