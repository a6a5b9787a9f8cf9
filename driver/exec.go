package driver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"syscall"
	"time"

	"github.com/creack/pty"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
)

// ExecCommand is the hidden argv[1] that runs a command inside a task's
// context for `nomad alloc exec` and script checks: it joins the task cgroup,
// drops to the task user, changes to the task dir, then execs the command.
const ExecCommand = "__singleton-exec"

// MaybeRunExec execs into the command and never returns if args ask for it.
func MaybeRunExec(args []string) {
	if len(args) < 5 || args[1] != ExecCommand || args[3] != "--" {
		return
	}
	err := execInTask(args[2], args[4:])
	fmt.Fprintf(os.Stderr, "singleton exec: %v\n", err)
	os.Exit(127)
}

func execInTask(path string, argv []string) error {
	dir, err := securefs.OpenPrivate(path, false)
	if err != nil {
		return err
	}
	var spec supervisorSpec
	err = readJSON(dir, specFile, &spec)
	dir.Close()
	if err != nil {
		return err
	}
	if err := joinCgroups(spec.CgroupProcs); err != nil {
		return err
	}
	if spec.WorkDir != "" {
		if err := os.Chdir(spec.WorkDir); err != nil {
			return err
		}
	}
	bin, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	if spec.UID != nil {
		groups := make([]int, len(spec.Groups))
		for i, g := range spec.Groups {
			groups[i] = int(g)
		}
		if err := syscall.Setgroups(groups); err != nil {
			return fmt.Errorf("setgroups: %w", err)
		}
		if err := syscall.Setgid(int(spec.GID)); err != nil {
			return fmt.Errorf("setgid: %w", err)
		}
		if err := syscall.Setuid(int(*spec.UID)); err != nil {
			return fmt.Errorf("setuid: %w", err)
		}
	}
	return syscall.Exec(bin, argv, workloadEnv(os.Environ(), spec.ShareNomadToken))
}

// execCmd builds the command that runs argv in the task's context.
func (h *taskHandle) execCmd(ctx context.Context, argv []string) (*exec.Cmd, error) {
	if len(argv) == 0 {
		return nil, errors.New("exec: no command given")
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self, append([]string{ExecCommand, h.dir.Path(), "--"}, argv...)...)
	env := make([]string, 0, len(h.cfg.Env))
	for k, v := range h.cfg.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	cmd.Env = env
	return cmd, nil
}

// ExecTask runs a command to completion in the task's context (script checks).
func (d *Driver) ExecTask(taskID string, argv []string, timeout time.Duration) (*drivers.ExecTaskResult, error) {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	ctx, cancel := context.WithTimeout(d.ctx, timeout)
	defer cancel()
	cmd, err := h.execCmd(ctx, argv)
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	res := &drivers.ExitResult{}
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return nil, fmt.Errorf("exec %q: %w", argv[0], err)
		}
	}
	res.ExitCode = cmd.ProcessState.ExitCode()
	return &drivers.ExecTaskResult{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), ExitResult: res}, nil
}

var _ drivers.ExecTaskStreamingDriver = (*Driver)(nil)

// ExecTaskStreaming serves `nomad alloc exec`, with or without a TTY.
func (d *Driver) ExecTaskStreaming(ctx context.Context, taskID string, opts *drivers.ExecOptions) (*drivers.ExitResult, error) {
	h, ok := d.tasks.get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	cmd, err := h.execCmd(ctx, opts.Command)
	if err != nil {
		return nil, err
	}
	if opts.Tty {
		err = runWithTTY(cmd, opts)
	} else {
		err = runWithPipes(cmd, opts)
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return nil, fmt.Errorf("exec %q: %w", opts.Command[0], err)
	}
	return &drivers.ExitResult{ExitCode: cmd.ProcessState.ExitCode()}, nil
}

func runWithPipes(cmd *exec.Cmd, opts *drivers.ExecOptions) error {
	cmd.Stdin, cmd.Stdout, cmd.Stderr = opts.Stdin, opts.Stdout, opts.Stderr
	cmd.WaitDelay = time.Second
	return cmd.Run()
}

func runWithTTY(cmd *exec.Cmd, opts *drivers.ExecOptions) error {
	ptmx, err := pty.Start(cmd)
	if err != nil {
		return err
	}
	defer ptmx.Close()
	go func() {
		for size := range opts.ResizeCh {
			_ = pty.Setsize(ptmx, &pty.Winsize{Rows: uint16(size.Height), Cols: uint16(size.Width)})
		}
	}()
	go func() { _, _ = io.Copy(ptmx, opts.Stdin) }()
	copied := make(chan struct{})
	go func() {
		_, _ = io.Copy(opts.Stdout, ptmx) // ends with EIO once the command exits
		close(copied)
	}()
	err = cmd.Wait()
	select {
	case <-copied:
	case <-time.After(time.Second):
	}
	return err
}
