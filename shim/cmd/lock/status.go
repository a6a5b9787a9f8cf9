package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// runStatus is `lock status`: who holds the lock at a path.
func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lock status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = helpFor(fs, stderr, statusHelpHead, "")
	asJSON := fs.Bool("json", false, "print JSON")
	namespace := fs.String("namespace", "", settingUsage("namespace"))
	conn := newConnFlags(fs)
	holders := fs.Int("n", 0, "the semaphore's `N` (default: as recorded in <path>/semaphore or its slot 0, when <path> is no lock itself)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return shim.ExitConfig
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "lock status: give exactly one lock path, e.g. lock status nomad/jobs/web/lock")
		return shim.ExitConfig
	}
	if err := conn.refuseToken(); err != nil {
		fmt.Fprintf(stderr, "lock status: %v\n", err)
		return shim.ExitConfig
	}
	cfg := shim.DefaultConfig()
	cfg.Path, cfg.Namespace = fs.Arg(0), *namespace
	conn.apply(&cfg)
	if err := cfg.ValidateLock(); err != nil {
		fmt.Fprintf(stderr, "lock status: %v\n", err)
		return shim.ExitConfig
	}
	locker, err := shim.NewLocker(shim.Spec{Config: cfg}, newLogger(stderr, false))
	if err != nil {
		fmt.Fprintf(stderr, "lock status: %v\n", err)
		return shim.ExitConfig
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var st lockclient.Status
	if *holders == 0 {
		st, err = locker.Status(ctx)
		if err == nil && !st.Exists {
			*holders, err = locker.RecordedHolders(ctx)
		}
	}
	if err == nil && *holders > 0 {
		cfg.Holders = *holders
		return statusOfSlots(ctx, cfg, *asJSON, stdout, stderr)
	}
	if err != nil {
		return statusError(err, stderr)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
		return 0
	}
	printStatus(stdout, st)
	return 0
}

func printStatus(w io.Writer, st lockclient.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	defer tw.Flush()
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t= %s\n", k, v) }
	row("Path", st.Path)
	if !st.Exists {
		row("Held", "false (the variable does not exist)")
		return
	}
	held := fmt.Sprint(st.Held)
	if !st.HeldKnown {
		held = "unknown (Nomad shows lock state only to management tokens)"
	}
	row("Held", held)
	label := "Holder"
	if !st.Held {
		label = "Last holder"
	}
	h := st.Holder
	row(label, h.String())
	if h.AllocID != "" {
		row("Alloc ID", h.AllocID)
	}
	if h.JobID != "" {
		row("Job/Group/Task", strings.Join([]string{h.JobID, h.Group, h.Task}, "/"))
	}
	if h.Hostname != "" {
		row("Host/PID", fmt.Sprintf("%s/%d", h.Hostname, h.PID))
	}
	if h.Upstream != "" {
		row("Upstream", h.Upstream)
	}
	row("Fence", fmt.Sprint(st.Fence))
	row("TTL", st.TTL)
	row("Lock delay", st.LockDelay)
	if !h.AcquiredAt.IsZero() {
		row("Acquired", fmt.Sprintf("%s (%s ago)", h.AcquiredAt.Format(time.RFC3339), time.Since(h.AcquiredAt).Round(time.Second)))
	}
	if !st.ModifiedAt.IsZero() {
		row("Modified", st.ModifiedAt.Format(time.RFC3339))
	}
}

func statusError(err error, stderr io.Writer) int {
	fmt.Fprintf(stderr, "lock status: %v\n", err)
	var pe *lockclient.PermissionError
	if errors.As(err, &pe) {
		return shim.ExitPermission
	}
	return shim.ExitInfra
}

// statusOfSlots is `lock status` of a semaphore: one row per slot.
func statusOfSlots(ctx context.Context, cfg shim.Config, asJSON bool, stdout, stderr io.Writer) int {
	if err := cfg.ValidateLock(); err != nil {
		fmt.Fprintf(stderr, "lock status: %v\n", err)
		return shim.ExitConfig
	}
	locker, err := shim.NewLocker(shim.Spec{Config: cfg}, newLogger(stderr, false))
	if err != nil {
		fmt.Fprintf(stderr, "lock status: %v\n", err)
		return shim.ExitConfig
	}
	slots, err := locker.SlotStatus(ctx)
	if err != nil {
		return statusError(err, stderr)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(slots)
		return 0
	}
	printSlots(stdout, cfg.Path, slots, time.Now())
	return 0
}

func printSlots(w io.Writer, prefix string, slots []lockclient.Status, now time.Time) {
	fmt.Fprintf(w, "Semaphore %s: %d holders\n", prefix, len(slots))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "Slot\tState\tHolder\tAlloc ID\tFence\tSince")
	for i, st := range slots {
		state, holder, alloc, fence, since := "free", "-", "-", "-", "-"
		switch {
		case !st.Exists:
			state = "free (never held)"
		case !st.HeldKnown:
			state = "unknown"
		case st.Held:
			state = "held"
		}
		if st.Exists && !st.Holder.IsZero() {
			holder = st.Holder.String()
			alloc = cmp.Or(st.Holder.AllocID, "-")
			fence = fmt.Sprint(st.Fence)
			if at := st.Holder.AcquiredAt; !at.IsZero() {
				since = fmt.Sprintf("%s (%s ago)", at.Format(time.RFC3339), now.Sub(at).Round(time.Second))
			}
			if !st.Held && st.HeldKnown {
				holder = "last: " + holder
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", i, state, holder, alloc, fence, since)
	}
}
