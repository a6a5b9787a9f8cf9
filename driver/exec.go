package driver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/creack/pty"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
)

// ExecCommand is the hidden argv[1] that runs a command inside a task's
// context for `nomad alloc exec` and script checks: it joins the task cgroup,
// sets the workload's oom_score_adj, drops to the task user, changes to the
// task's work_dir (the task dir by default), then execs the command.
const ExecCommand = "__singleton-exec"

// The exec helper's exit codes when it cannot exec the command, as a shell's.
const (
	execCannotExec = 126 // found but cannot be executed, or the task's context cannot be entered
	execNotFound   = 127 // not found
)

// MaybeRunExec execs into the command and never returns if args ask for it.
func MaybeRunExec(args []string) {
	if len(args) < 5 || args[1] != ExecCommand || args[3] != "--" {
		return
	}
	code, err := execInTask(args[2], args[4:])
	fmt.Fprintf(os.Stderr, "singleton: cannot run %q: %v\n", args[4], err)
	os.Exit(code)
}

// execInTask joins the task cgroup, drops to the task user, enters work_dir
// and execs argv.
// It returns only on failure, with the exit code to use: 127 when the
// command is not found, 126 when it cannot be run.
func execInTask(path string, argv []string) (int, error) {
	dir, err := securefs.OpenPrivate(path, false)
	if err != nil {
		return execCannotExec, err
	}
	var spec supervisorSpec
	err = readSpec(dir, &spec)
	dir.Close()
	if err != nil {
		return execCannotExec, err
	}
	if err := joinCgroups(spec.CgroupProcs); err != nil {
		return execCannotExec, err
	}
	// Before dropping privileges: lowering it back from the supervisor's
	// value needs CAP_SYS_RESOURCE, and the workload cannot lower it again.
	if err := setOOMScoreAdj(spec.OOMScoreAdj); err != nil {
		return execCannotExec, fmt.Errorf("set the workload's oom_score_adj to config.oom_score_adj = %d: %w", spec.OOMScoreAdj, err)
	}
	env := workloadEnv(os.Environ(), spec.ShareNomadToken, spec.DeniedEnvvars)
	if spec.UID != nil {
		groups := make([]int, len(spec.Groups))
		for i, g := range spec.Groups {
			groups[i] = int(g)
		}
		if err := syscall.Setgroups(groups); err != nil {
			return execCannotExec, fmt.Errorf("setgroups: %w", err)
		}
		if err := syscall.Setgid(int(spec.GID)); err != nil {
			return execCannotExec, fmt.Errorf("setgid: %w", err)
		}
		if err := syscall.Setuid(int(*spec.UID)); err != nil {
			return execCannotExec, fmt.Errorf("setuid: %w", err)
		}
	}
	// Only now, as the task user: a work_dir of the job's choosing must not
	// give the workload a way into a directory it could not reach itself.
	if spec.WorkDir != "" {
		if err := os.Chdir(spec.WorkDir); err != nil {
			return execCannotExec, fmt.Errorf("config.work_dir: the task user cannot enter %s: %w", spec.WorkDir, err)
		}
	}
	// The command is looked up as the task user, in the workload's PATH.
	bin, err := lookPath(argv[0], env)
	if err != nil {
		return execNotFound, err
	}
	err = syscall.Exec(bin, argv, env)
	if errors.Is(err, syscall.ENOENT) {
		return execNotFound, err
	}
	return execCannotExec, err
}

// lookPath resolves file like exec.LookPath, with PATH taken from env.
func lookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		return exec.LookPath(file)
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		if p, err := exec.LookPath(filepath.Join(d, file)); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: %w", file, exec.ErrNotFound)
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
