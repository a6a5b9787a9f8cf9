package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// runList is `lock list`: every lock under a prefix, one line each.
func runList(args []string, stdout, stderr io.Writer) int {
	f := newReadFlags(true, stderr)
	fs, asJSON, namespace, conn, prefix := f.fs, f.asJSON, f.namespace, f.conn, f.prefix
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return shim.ExitConfig
	}
	if fs.NArg() != 0 {
		fmt.Fprintln(stderr, "lock list: no argument; give the prefix with -prefix, e.g. lock list -prefix nomad/jobs/web")
		return shim.ExitConfig
	}
	if err := conn.refuseToken(); err != nil {
		fmt.Fprintf(stderr, "lock list: %v\n", err)
		return shim.ExitConfig
	}
	cfg := shim.DefaultConfig()
	// The Locker is built for a path of its own; List reads each lock at
	// its own path.
	cfg.Path, cfg.Namespace = "lock-list", *namespace
	conn.apply(&cfg)
	locker, code := statusLocker(cfg, stderr)
	if locker == nil {
		return code
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	locks, err := locker.List(ctx, *prefix)
	if err != nil {
		return statusError("lock list", err, stderr)
	}
	now := time.Now()
	out := statusOutput{Schema: statusSchema, Prefix: *prefix, Locks: []lockJSON{}}
	for _, st := range locks {
		out.Locks = append(out.Locks, newLockJSON(st, now))
	}
	if *asJSON {
		return printJSON(stdout, out)
	}
	printList(stdout, out.Locks)
	return 0
}

// printList writes one line per lock.
func printList(w io.Writer, locks []lockJSON) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "Path\tMode\tState\tHolder alloc\tJob\tSince\tFence")
	for _, j := range locks {
		alloc, job, since := "-", "-", "-"
		if h := j.Holder; h != nil {
			alloc, job = orDash(h.AllocID), orDash(h.JobID)
		}
		if j.HeldSince != nil {
			since = fmt.Sprintf("%s (%s ago)", j.HeldSince.Format(time.RFC3339), ago(*j.HeldSince))
		}
		mode := j.Mode
		if j.Slot != nil {
			mode = fmt.Sprintf("slot %d", *j.Slot)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\n", j.Path, mode, j.State, alloc, job, since, j.Fence)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
