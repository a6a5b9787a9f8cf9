package main

import (
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
	address := fs.String("address", "", addressUsage)
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
	cfg := shim.DefaultConfig()
	cfg.Path, cfg.Namespace, cfg.Address = fs.Arg(0), *namespace, *address
	if err := cfg.ValidateLock(); err != nil {
		fmt.Fprintf(stderr, "lock status: %v\n", err)
		return shim.ExitConfig
	}
	locker, err := shim.NewLocker(cfg, newLogger(stderr, false), lockclient.Holder{})
	if err != nil {
		fmt.Fprintf(stderr, "lock status: %v\n", err)
		return shim.ExitConfig
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := locker.Status(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "lock status: %v\n", err)
		var pe *lockclient.PermissionError
		if errors.As(err, &pe) {
			return shim.ExitPermission
		}
		return shim.ExitInfra
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
