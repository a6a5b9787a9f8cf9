package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient/allocs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// readFlags are the flags of `lock status` and `lock list`.
type readFlags struct {
	fs        *flag.FlagSet
	asJSON    *bool
	namespace *string
	conn      *connFlags
	holders   *int    // status
	prefix    *string // list
}

func newReadFlags(list bool, stderr io.Writer) *readFlags {
	name, head := "lock status", statusHelpHead
	if list {
		name, head = "lock list", listHelpHead
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = helpFor(fs, stderr, head, statusHelpTail)
	f := &readFlags{fs: fs}
	f.asJSON = fs.Bool("json", false, "print JSON (its schema: docs/cli.md)")
	if list {
		f.namespace = fs.String("namespace", "", settingUsage("namespace")+`; "*" for every namespace`)
		f.prefix = fs.String("prefix", "", "list the locks whose path begins with `prefix` (default: every lock the token may list)")
	} else {
		f.namespace = fs.String("namespace", "", settingUsage("namespace"))
		f.holders = fs.Int("n", 0, "the semaphore's `N` (default: as recorded in <path>/semaphore or its slot 0, when <path> is no lock itself)")
	}
	f.conn = newConnFlags(fs)
	return f
}

// runStatus is `lock status`: who holds the lock at a path.
func runStatus(args []string, stdout, stderr io.Writer) int {
	f := newReadFlags(false, stderr)
	fs, asJSON, namespace, conn, holders := f.fs, f.asJSON, f.namespace, f.conn, f.holders
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
	locker, code := statusLocker(cfg, stderr)
	if locker == nil {
		return code
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var st lockclient.Status
	var err error
	if *holders == 0 {
		st, err = locker.Status(ctx)
		if err == nil && !st.Exists {
			*holders, err = locker.RecordedHolders(ctx)
		}
	}
	if err != nil {
		return statusError("lock status", err, stderr)
	}
	now := time.Now()
	out := statusOutput{Schema: statusSchema, Path: cfg.Path}
	if *holders == 0 {
		out.Locks = []lockJSON{newLockJSON(st, now)}
		if h := out.Locks[0].Holder; h != nil {
			h.JobVersion = jobVersion(ctx, locker, st)
		}
	} else {
		cfg.Holders = *holders
		if locker, code = statusLocker(cfg, stderr); locker == nil {
			return code
		}
		slots, err := locker.SlotStatus(ctx)
		if err != nil {
			return statusError("lock status", err, stderr)
		}
		out.SemaphoreHolders = *holders
		for _, s := range slots {
			out.Locks = append(out.Locks, newLockJSON(s, now))
		}
	}
	if *asJSON {
		return printJSON(stdout, out)
	}
	if *holders > 0 {
		printSlots(stdout, cfg.Path, out.Locks)
		return 0
	}
	printStatus(stdout, out.Locks[0])
	return 0
}

// statusLocker is the Locker that reads cfg's lock, or nil and the exit code.
func statusLocker(cfg shim.Config, stderr io.Writer) (*lockclient.Locker, int) {
	if err := cfg.ValidateLock(); err != nil {
		fmt.Fprintf(stderr, "lock status: %v\n", err)
		return nil, shim.ExitConfig
	}
	locker, err := shim.NewLocker(shim.Spec{Config: cfg}, newLogger(stderr, false))
	if err != nil {
		fmt.Fprintf(stderr, "lock status: %v\n", err)
		return nil, shim.ExitConfig
	}
	return locker, 0
}

// statusSchema is the version of the JSON of `lock status -json` and `lock
// list -json` (docs/cli.md): a field is only ever added to it; a change to
// what a field means or a removal comes with a new number.
const statusSchema = 1

// statusOutput is the JSON of `lock status` and `lock list`.
type statusOutput struct {
	Schema int `json:"schema"`
	// Path is the path asked for (status), Prefix the prefix (list).
	Path   string `json:"path,omitempty"`
	Prefix string `json:"prefix,omitempty"`
	// SemaphoreHolders is N for a semaphore's status (its slots are Locks).
	SemaphoreHolders int        `json:"semaphore_holders,omitempty"`
	Locks            []lockJSON `json:"locks"`
}

// lockJSON is one lock. Times are RFC 3339, ages in seconds; null where
// unknown.
type lockJSON struct {
	Path      string `json:"path"`
	Namespace string `json:"namespace"`
	// Mode is "lock", "lease" (a heartbeat beside it) or "semaphore_slot".
	Mode   string `json:"mode"`
	Slot   *int   `json:"slot"`
	Exists bool   `json:"exists"`
	// State is "held", "free" or "unknown"; Basis says how it was told.
	State string `json:"state"`
	Basis string `json:"basis"`
	// Fence is the variable's ModifyIndex (the holder's fence while it
	// holds the lock and has not written its record since).
	Fence      uint64     `json:"fence"`
	TTL        string     `json:"ttl,omitempty"`
	LockDelay  string     `json:"lock_delay,omitempty"`
	ModifiedAt *time.Time `json:"modified_at"`
	// Holder is the last holder the record names (it stays after a release).
	Holder *holderRecordJSON `json:"holder"`
	// HeldSince is the holder's acquire, unless the lock is free.
	HeldSince     *time.Time `json:"held_since"`
	ReleasedClean bool       `json:"released_clean"`
	ReleasedAt    *time.Time `json:"released_at"`
	// LastRenewAge: lease mode only (the heartbeat records it).
	LastRenewAge *float64       `json:"last_renew_age_seconds"`
	Heartbeat    *heartbeatJSON `json:"heartbeat"`
}

// holderRecordJSON is the holder a lock's record names.
type holderRecordJSON struct {
	AllocID    string     `json:"alloc_id"`
	JobID      string     `json:"job_id"`
	Group      string     `json:"group"`
	Task       string     `json:"task"`
	Node       string     `json:"node"`
	Hostname   string     `json:"hostname"`
	PID        int        `json:"pid"`
	Upstream   string     `json:"upstream,omitempty"`
	AcquiredAt *time.Time `json:"acquired_at"`
	// JobVersion is the holder allocation's job version, when the token may
	// read the allocation (read-job); status only.
	JobVersion *uint64 `json:"job_version"`
}

// heartbeatJSON is lease mode's heartbeat.
type heartbeatJSON struct {
	Path     string  `json:"path"`
	Seq      uint64  `json:"seq"`
	Epoch    uint64  `json:"epoch"`
	AllocID  string  `json:"alloc_id"`
	AgeSecs  float64 `json:"age_seconds"`
	Interval float64 `json:"interval_seconds"`
	RenewAge float64 `json:"renew_age_seconds"`
	SealedBy string  `json:"sealed_by,omitempty"`
	Sealed   bool    `json:"sealed"`
}

func newLockJSON(st lockclient.Status, now time.Time) lockJSON {
	at := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		t = t.UTC()
		return &t
	}
	j := lockJSON{Path: st.Path, Namespace: cmp.Or(st.Namespace, "default"), Mode: "lock", Exists: st.Exists,
		State: string(st.State), Basis: st.Basis, Fence: st.Fence}
	if !st.Exists {
		return j
	}
	h := st.Holder
	j.TTL, j.LockDelay, j.ModifiedAt = st.TTL, st.LockDelay, at(st.ModifiedAt)
	if h.Holders > 0 {
		slot := h.Slot
		j.Mode, j.Slot = "semaphore_slot", &slot
	}
	if !h.IsZero() {
		j.Holder = &holderRecordJSON{AllocID: h.AllocID, JobID: h.JobID, Group: h.Group, Task: h.Task, Node: h.Node,
			Hostname: h.Hostname, PID: h.PID, Upstream: h.Upstream, AcquiredAt: at(h.AcquiredAt)}
	}
	if st.State != lockclient.LockFree {
		j.HeldSince = at(h.AcquiredAt)
	}
	j.ReleasedClean, j.ReleasedAt = h.ReleasedClean, at(h.ReleasedAt)
	if hb := st.Heartbeat; hb != nil {
		j.Mode = "lease"
		age := max(now.Sub(hb.ModifiedAt), 0)
		j.Heartbeat = &heartbeatJSON{Path: hb.Path, Seq: hb.Seq, Epoch: hb.Epoch, AllocID: hb.AllocID,
			AgeSecs: age.Seconds(), Interval: hb.Interval.Seconds(), RenewAge: hb.RenewAge.Seconds(),
			SealedBy: hb.SealedBy, Sealed: hb.SealedBy != ""}
		if st.State != lockclient.LockFree && hb.AllocID == h.AllocID && hb.SealedBy == "" {
			renew := (age + hb.RenewAge).Seconds()
			j.LastRenewAge = &renew
		}
	}
	return j
}

// jobVersion is the job version of st's holder allocation, when the token
// may read it.
func jobVersion(ctx context.Context, l *lockclient.Locker, st lockclient.Status) *uint64 {
	if st.Holder.AllocID == "" {
		return nil
	}
	reader, err := allocs.New(allocs.ConfigOf(l))
	if err != nil {
		return nil
	}
	alloc, _, err := reader.Allocation(ctx, st.Holder.AllocID, st.Namespace, 0)
	if err != nil || alloc == nil || alloc.Job == nil || alloc.Job.Version == nil {
		return nil
	}
	v := *alloc.Job.Version
	return &v
}

func printJSON(w io.Writer, v any) int {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
	return 0
}

func printStatus(w io.Writer, j lockJSON) {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	defer tw.Flush()
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t= %s\n", k, v) }
	row("Path", j.Path)
	if !j.Exists {
		row("Held", "false (the variable does not exist)")
		return
	}
	held := map[string]string{"held": "true", "free": "false", "unknown": "unknown"}[j.State]
	row("Held", held)
	row("How known", j.Basis)
	row("Mode", j.Mode)
	label := "Holder"
	if j.State != "held" {
		label = "Last holder"
	}
	if h := j.Holder; h != nil {
		row(label, holderLine(*h))
		if h.AllocID != "" {
			row("Alloc ID", h.AllocID)
		}
		if h.JobID != "" {
			row("Job/Group/Task", strings.Join([]string{h.JobID, h.Group, h.Task}, "/"))
		}
		if h.JobVersion != nil {
			row("Job version", strconv.FormatUint(*h.JobVersion, 10))
		}
		if h.Node != "" {
			row("Node", h.Node)
		}
		if h.Hostname != "" {
			row("Host/PID", fmt.Sprintf("%s/%d", h.Hostname, h.PID))
		}
		if h.Upstream != "" {
			row("Upstream", h.Upstream)
		}
	}
	row("Fence", fmt.Sprint(j.Fence))
	row("TTL", j.TTL)
	row("Lock delay", j.LockDelay)
	if j.Holder != nil && j.Holder.AcquiredAt != nil {
		row("Acquired", fmt.Sprintf("%s (%s ago)", j.Holder.AcquiredAt.Format(time.RFC3339), ago(*j.Holder.AcquiredAt)))
	}
	switch {
	case j.LastRenewAge != nil:
		row("Last renew", fmt.Sprintf("%s ago (from the heartbeat)", secs(*j.LastRenewAge)))
	case j.State != "free":
		row("Last renew", "unknown (only a lease-mode heartbeat records it)")
	}
	if hb := j.Heartbeat; hb != nil {
		beat := fmt.Sprintf("seq %d, %s ago (every %s), epoch %d, %s", hb.Seq, secs(hb.AgeSecs), secs(hb.Interval), hb.Epoch, hb.Path)
		if hb.Sealed {
			beat += ", sealed by standby " + hb.SealedBy
		}
		row("Heartbeat", beat)
	}
	row("Released clean", fmt.Sprint(j.ReleasedClean))
	if j.ReleasedAt != nil {
		row("Released", fmt.Sprintf("%s (%s ago)", j.ReleasedAt.Format(time.RFC3339), ago(*j.ReleasedAt)))
	}
	if j.ModifiedAt != nil {
		row("Modified", j.ModifiedAt.Format(time.RFC3339))
	}
}

// holderLine is a holder in short: "alloc 5d0c3a1e on node-2".
func holderLine(h holderRecordJSON) string {
	return lockclient.Holder{AllocID: h.AllocID, Node: h.Node, Hostname: h.Hostname, PID: h.PID}.String()
}

func ago(t time.Time) string { return time.Since(t).Round(time.Second).String() }

func secs(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(100 * time.Millisecond).String()
}

func statusError(cmd string, err error, stderr io.Writer) int {
	fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
	var pe *lockclient.PermissionError
	if errors.As(err, &pe) {
		return shim.ExitPermission
	}
	return shim.ExitInfra
}

// printSlots is `lock status` of a semaphore: one row per slot.
func printSlots(w io.Writer, prefix string, slots []lockJSON) {
	fmt.Fprintf(w, "Semaphore %s: %d holders\n", prefix, len(slots))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "Slot\tState\tHolder\tAlloc ID\tFence\tSince")
	for i, j := range slots {
		state, holder, alloc, fence, since := j.State, "-", "-", "-", "-"
		if !j.Exists {
			state = "free (never held)"
		}
		if h := j.Holder; h != nil {
			holder = holderLine(*h)
			alloc = cmp.Or(h.AllocID, "-")
			fence = fmt.Sprint(j.Fence)
			if h.AcquiredAt != nil {
				since = fmt.Sprintf("%s (%s ago)", h.AcquiredAt.Format(time.RFC3339), ago(*h.AcquiredAt))
			}
			if j.State == "free" {
				holder = "last: " + holder
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", i, state, holder, alloc, fence, since)
	}
}
