package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/allocs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// Exit codes of `lock step-down` besides the shared ones (docs/cli.md).
const (
	// exitRefused: refused with no effect (no holder, no standby, -to not
	// a standby, a holder that offers no step-down).
	exitRefused = 1
	// The request was sent but the lock did not move as asked within the
	// bound: shim.ExitWaitTimeout (75).
)

// defaultStepDownWait is -wait's default.
const defaultStepDownWait = 30 * time.Second

// releaseMargin is added to the holder's own bound on its stop
// (Holder.StepDownWithin) for the command's wait for the release: the
// request's way to the holder, and a restart's to the client.
const releaseMargin = 15 * time.Second

// holderMargin is added to the handover's end for the wait for a new
// holder: the clocks of two hosts, and one acquire.
const holderMargin = 5 * time.Second

type stepDownFlags struct {
	fs        *flag.FlagSet
	to        *string
	wait      *time.Duration
	asJSON    *bool
	namespace *string
	conn      *connFlags
}

func newStepDownFlags(stderr io.Writer) *stepDownFlags {
	fs := flag.NewFlagSet("lock step-down", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = helpFor(fs, stderr, stepDownHelpHead, stepDownHelpTail)
	f := &stepDownFlags{fs: fs}
	f.to = fs.String("to", "", "the waiting standby that alone may take the lock next: its `alloc_id`, or a unique prefix of it "+
		"(default: any standby but the holder)")
	f.wait = fs.Duration("wait", defaultStepDownWait, "how long, from the holder's release, the other standbys give way to -to "+
		"(without -to, how long the holder stays out of the race)")
	f.asJSON = fs.Bool("json", false, "print JSON (its schema: docs/cli.md)")
	f.namespace = fs.String("namespace", "", settingUsage("namespace"))
	f.conn = newConnFlags(fs)
	return f
}

// parseInterspersed parses args with fs, flags before and after the
// arguments (lock step-down <path> -to <alloc>), and returns the arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var out []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return out, nil
		}
		out = append(out, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// stepDown is one run of `lock step-down`.
type stepDown struct {
	locker *lockclient.Locker
	allocs *allocs.Reader
	path   string
	ns     string
	to     string // the target's key, once resolved
	wait   time.Duration
	stderr io.Writer
}

// refusal is an end of the command with its exit code and message.
type refusal struct {
	code int
	msg  string
}

func (r *refusal) Error() string { return r.msg }

func refuse(code int, format string, args ...any) error {
	return &refusal{code: code, msg: fmt.Sprintf(format, args...)}
}

// runStepDown is `lock step-down`: asks the holder of a lock to hand it
// over to a waiting standby.
func runStepDown(args []string, stdout, stderr io.Writer) int {
	f := newStepDownFlags(stderr)
	paths, err := parseInterspersed(f.fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return shim.ExitConfig
	}
	if len(paths) != 1 {
		fmt.Fprintln(stderr, "lock step-down: give exactly one lock path, e.g. lock step-down nomad/jobs/web/lock")
		return shim.ExitConfig
	}
	if *f.wait <= 0 {
		fmt.Fprintln(stderr, "lock step-down: -wait must be more than 0, e.g. -wait 30s")
		return shim.ExitConfig
	}
	if err := f.conn.refuseToken(); err != nil {
		fmt.Fprintf(stderr, "lock step-down: %v\n", err)
		return shim.ExitConfig
	}
	cfg := shim.DefaultConfig()
	cfg.Path, cfg.Namespace = paths[0], *f.namespace
	f.conn.apply(&cfg)
	locker, code := statusLocker(cfg, stderr)
	if locker == nil {
		return code
	}
	reader, err := allocs.New(allocs.ConfigOf(locker))
	if err != nil {
		fmt.Fprintf(stderr, "lock step-down: %v\n", err)
		return shim.ExitConfig
	}
	sd := &stepDown{locker: locker, allocs: reader, path: cfg.Path, ns: cfg.Namespace, wait: *f.wait, stderr: stderr}
	out, err := sd.run(*f.to)
	var r *refusal
	var pe *lockclient.StepDownPermissionError
	switch {
	case errors.As(err, &r):
		fmt.Fprintf(stderr, "lock step-down: %s\n", r.msg)
		return r.code
	case errors.As(err, &pe):
		fmt.Fprintf(stderr, "lock step-down: %v\n", err)
		return shim.ExitPermission
	case err != nil:
		return statusError("lock step-down", err, stderr)
	}
	if *f.asJSON {
		printJSON(stdout, out)
	} else {
		printStepDown(stdout, out)
	}
	if out.Outcome == outcomeMoved || out.Outcome == outcomeLanded {
		return 0
	}
	return shim.ExitWaitTimeout
}

// Outcomes of a step-down that was asked (stepDownOutput.Outcome).
const (
	outcomeMoved       = "moved"        // another standby holds the lock (no -to)
	outcomeLanded      = "landed"       // the -to standby holds it
	outcomeMissed      = "missed"       // another than the -to standby holds it
	outcomeTookBack    = "took_back"    // nobody else took it within -wait: the former holder did
	outcomeNotHeld     = "not_held"     // released, but nobody holds it yet
	outcomeNotReleased = "not_released" // the holder did not step down in time
)

// stepDownOutput is the JSON of `lock step-down` (schema: docs/cli.md).
type stepDownOutput struct {
	Schema    int    `json:"schema"`
	Path      string `json:"path"`
	Namespace string `json:"namespace"`
	// Outcome is one of the outcome constants.
	Outcome string `json:"outcome"`
	// To is the standby -to named (its full allocation ID), or null.
	To          *string           `json:"to"`
	WaitSeconds float64           `json:"wait_seconds"`
	Previous    *holderRecordJSON `json:"previous"`
	// ReleasedAt is the previous holder's release mark, when it was seen.
	ReleasedAt *time.Time `json:"released_at"`
	// Holder is who holds the lock when the command ends, or null.
	Holder *holderRecordJSON `json:"holder"`
	Fence  uint64            `json:"fence"`
}

func (sd *stepDown) run(to string) (stepDownOutput, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	target, err := sd.locker.StepDownTarget(ctx)
	switch {
	case errors.Is(err, lockclient.ErrNoHolder):
		return stepDownOutput{}, refuse(exitRefused, "%v: nothing to step down", err)
	case errors.Is(err, lockclient.ErrLockIDHidden):
		return stepDownOutput{}, refuse(shim.ExitPermission, "%v: only a token that could release the lock may ask its holder "+
			"to step down, and Nomad shows this one no lock ID; use a management token", err)
	case err != nil:
		return stepDownOutput{}, err
	}
	holder := target.Holder
	if err := sd.checkHolder(holder); err != nil {
		return stepDownOutput{}, err
	}
	if err := sd.locker.MayRequestStepDown(ctx); err != nil {
		return stepDownOutput{}, err
	}
	if err := sd.chooseStandby(ctx, holder, to); err != nil {
		return stepDownOutput{}, err
	}
	gate := holder.StepDown == lockclient.StepDownRestart
	if gate {
		if err := sd.allocs.RestartAllocation(ctx, sd.path, holder.AllocID, sd.ns, true); err != nil {
			return stepDownOutput{}, err
		}
	}
	sent := time.Now()
	req, err := sd.locker.SendStepDown(ctx, target, lockclient.StepDownRequest{To: sd.to, Wait: sd.wait, Expires: sent.Add(sd.wait)})
	if err != nil {
		return stepDownOutput{}, err
	}
	if gate {
		// Nomad's answer comes once every task was killed (the gate's
		// release among them); the lock is watched meanwhile.
		restarted := make(chan error, 1)
		go func() {
			restarted <- sd.allocs.RestartAllocation(context.Background(), sd.path, holder.AllocID, sd.ns, false)
		}()
		select {
		case err := <-restarted:
			if err != nil {
				cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer ccancel()
				if cerr := sd.locker.CancelStepDown(cctx, req); cerr != nil {
					fmt.Fprintf(sd.stderr, "lock step-down: withdrawing the request failed too (it expires at %s): %v\n",
						req.Expires.Format(time.RFC3339), cerr)
				}
				return stepDownOutput{}, fmt.Errorf("the holder is a gate, whose allocation must be restarted to step it down: %w", err)
			}
		case <-time.After(time.Second):
		}
	}
	return sd.await(holder, target.Index, sent), nil
}

// checkHolder refuses a holder that cannot step down.
func (sd *stepDown) checkHolder(h lockclient.Holder) error {
	switch {
	case h.Holders > 0:
		return refuse(exitRefused, "%s is slot %d of a semaphore: lock step-down moves a single lock only", sd.path, h.Slot)
	case h.StepDown == "":
		return refuse(exitRefused, "the holder, %s, offers no step-down: it runs a build without it, or its identity may not read "+
			"%s (the lock policy grants read there: examples/acl/singleton-lock.policy.hcl)", h, lockclient.StepDownPathFor(sd.path))
	case h.StepDown == lockclient.StepDownRestart && h.AllocID == "":
		return refuse(exitRefused, "the holder, %s, is a gate outside any allocation Nomad could restart", h)
	}
	return nil
}

// chooseStandby refuses when no standby waits, or when to names none of
// them, and sets sd.to to the named one's key.
func (sd *stepDown) chooseStandby(ctx context.Context, holder lockclient.Holder, to string) error {
	recorded, err := sd.locker.Standbys(ctx)
	if err != nil {
		return err
	}
	var waiting, stale []string
	var live []lockclient.Standby
	unchecked := false
	for _, s := range recorded {
		if s.Key == holder.Key() {
			continue
		}
		switch state := sd.standbyState(ctx, s); state {
		case "":
			live = append(live, s)
			waiting = append(waiting, standbyLine(s))
		case "unchecked":
			unchecked = true
			live = append(live, s)
			waiting = append(waiting, standbyLine(s))
		default:
			stale = append(stale, standbyLine(s)+" ("+state+")")
		}
	}
	staleNote := ""
	if len(stale) > 0 {
		staleNote = "; records of standbys that no longer wait: " + strings.Join(stale, ", ")
	}
	if len(live) == 0 {
		return refuse(exitRefused, "no standby waits for %s, so its holder (%s) would only hand the lock to itself%s. Standbys record "+
			"themselves under %s while they wait (their identity needs write and destroy there: examples/acl/singleton-lock.policy.hcl)",
			sd.path, holder, staleNote, lockclient.StandbyPrefixFor(sd.path))
	}
	if unchecked {
		fmt.Fprintln(sd.stderr, "lock step-down: the standbys' allocations could not be read (the token lacks read-job): "+
			"taking their records as they are")
	}
	if to == "" {
		return nil
	}
	if to == holder.Key() || (holder.AllocID != "" && strings.HasPrefix(holder.AllocID, to)) {
		return refuse(exitRefused, "-to %s names the holder itself; waiting standbys: %s", to, strings.Join(waiting, ", "))
	}
	var match []lockclient.Standby
	for _, s := range live {
		if s.Key == to || strings.HasPrefix(s.Key, to) {
			match = append(match, s)
		}
	}
	switch len(match) {
	case 0:
		return refuse(exitRefused, "-to %s is not a waiting standby of %s; waiting standbys: %s%s", to, sd.path,
			strings.Join(waiting, ", "), staleNote)
	case 1:
		sd.to = match[0].Key
		return nil
	}
	return refuse(shim.ExitConfig, "-to %s matches more than one standby: give more of the allocation ID (%s)", to, strings.Join(waiting, ", "))
}

// standbyState is "" for a standby whose allocation runs, "unchecked"
// when it cannot be read, else why its record is stale.
func (sd *stepDown) standbyState(ctx context.Context, s lockclient.Standby) string {
	if s.AllocID == "" {
		return "unchecked"
	}
	alloc, _, err := sd.allocs.Allocation(ctx, s.AllocID, sd.ns, 0)
	var pe *allocs.PermissionError
	switch {
	case errors.As(err, &pe), errors.Is(err, allocs.ErrHidden):
		return "unchecked"
	case errors.Is(err, allocs.ErrGone):
		return "its allocation is gone"
	case err != nil:
		return "unchecked"
	case alloc.DesiredStatus != api.AllocDesiredStatusRun:
		return "its allocation is being stopped"
	case alloc.ClientStatus != api.AllocClientStatusRunning && alloc.ClientStatus != api.AllocClientStatusPending:
		return "its allocation is " + alloc.ClientStatus
	}
	return ""
}

func standbyLine(s lockclient.Standby) string {
	where := s.Node
	if where == "" {
		where = s.Hostname
	}
	if where == "" {
		return s.Key
	}
	return s.Key + " on " + where
}

// await follows the lock from the request on: the holder's release (as
// long as its record says its stop may take, and a margin), then a new
// holder (until the handover's end and a margin).
func (sd *stepDown) await(prev lockclient.Holder, index uint64, sent time.Time) stepDownOutput {
	out := stepDownOutput{Schema: statusSchema, Path: sd.path, Namespace: nsOrDefault(sd.ns), WaitSeconds: sd.wait.Seconds(),
		Previous: holderJSON(prev)}
	if sd.to != "" {
		to := sd.to
		out.To = &to
	}
	releaseBy := time.Now().Add(prev.StepDownWithin + releaseMargin)
	var holderBy time.Time
	for {
		deadline := releaseBy
		if !holderBy.IsZero() {
			deadline = holderBy
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		st, next, err := sd.locker.StatusAfter(ctx, index)
		cancel()
		if err != nil {
			if time.Now().Before(deadline) {
				time.Sleep(time.Second)
				continue
			}
			if holderBy.IsZero() {
				out.Outcome = outcomeNotReleased
			} else {
				out.Outcome = outcomeNotHeld
			}
			return out
		}
		index = max(next, index)
		h := st.Holder
		if h.Handover.From == prev.Key() && holderBy.IsZero() {
			// The holder stepped down: its release is next, then the wait.
			holderBy = h.Handover.Until.Add(holderMargin)
			if !h.ReleasedAt.IsZero() {
				at := h.ReleasedAt.UTC()
				out.ReleasedAt = &at
			}
		}
		if !h.ReleasedAt.IsZero() && h.Handover.From == prev.Key() {
			at := h.ReleasedAt.UTC()
			out.ReleasedAt = &at
		}
		if newTenure(h, prev, sent) && st.State != lockclient.LockFree {
			out.Holder, out.Fence = holderJSON(h), st.Fence
			out.Outcome = outcomeOf(h.Key(), prev.Key(), sd.to)
			return out
		}
		if time.Now().After(deadline) {
			if holderBy.IsZero() {
				out.Outcome = outcomeNotReleased
			} else {
				out.Outcome = outcomeNotHeld
			}
			return out
		}
	}
}

// newTenure reports whether the record h is of an acquire after the
// request (by the former holder too, once its wait is over).
func newTenure(h, prev lockclient.Holder, sent time.Time) bool {
	if h.IsZero() || h.Handover.From != "" {
		return false
	}
	return h.Key() != prev.Key() || h.AcquiredAt.After(prev.AcquiredAt) && h.AcquiredAt.After(sent.Add(-time.Minute))
}

func outcomeOf(now, prev, to string) string {
	switch {
	case now == prev:
		return outcomeTookBack
	case to == "":
		return outcomeMoved
	case now == to:
		return outcomeLanded
	}
	return outcomeMissed
}

func holderJSON(h lockclient.Holder) *holderRecordJSON {
	if h.IsZero() {
		return nil
	}
	j := &holderRecordJSON{AllocID: h.AllocID, JobID: h.JobID, Group: h.Group, Task: h.Task, Node: h.Node,
		Hostname: h.Hostname, PID: h.PID, Upstream: h.Upstream}
	if !h.AcquiredAt.IsZero() {
		at := h.AcquiredAt.UTC()
		j.AcquiredAt = &at
	}
	return j
}

func nsOrDefault(ns string) string {
	if ns == "" {
		return "default"
	}
	return ns
}

// printStepDown says what became of the step-down.
func printStepDown(w io.Writer, o stepDownOutput) {
	prev := "an unknown holder"
	if o.Previous != nil {
		prev = holderLine(*o.Previous)
	}
	released := ""
	if o.ReleasedAt != nil {
		released = " at " + o.ReleasedAt.Format("15:04:05.000Z07:00")
	}
	now := ""
	if o.Holder != nil {
		now = holderLine(*o.Holder)
		if o.Holder.AcquiredAt != nil {
			now += " since " + o.Holder.AcquiredAt.Format("15:04:05.000Z07:00")
		}
		now += fmt.Sprintf(" (fence %d)", o.Fence)
	}
	wait := time.Duration(o.WaitSeconds * float64(time.Second))
	switch o.Outcome {
	case outcomeNotReleased:
		fmt.Fprintf(w, "%s: %s did not step down in time: its stop may still be under way (its events say), or it never "+
			"saw the request; the request expires by itself\n", o.Path, prev)
		return
	case outcomeNotHeld:
		fmt.Fprintf(w, "%s: %s stepped down%s; nobody holds the lock yet (lock status %s)\n", o.Path, prev, released, o.Path)
		return
	}
	fmt.Fprintf(w, "%s: %s stepped down%s.\nHeld by %s: ", o.Path, prev, released, now)
	switch o.Outcome {
	case outcomeLanded:
		fmt.Fprintln(w, "the standby -to named.")
	case outcomeMissed:
		fmt.Fprintf(w, "NOT the standby -to named (%s): it did not take the lock within -wait (%s), or another "+
			"standby does not give way (an older build).\n", *o.To, wait)
	case outcomeTookBack:
		fmt.Fprintf(w, "the former holder again: no other standby took the lock within -wait (%s).\n", wait)
	default:
		fmt.Fprintln(w, "another standby.")
	}
}
