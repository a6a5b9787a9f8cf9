package shim

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// Where is the set of places a lock setting may be written.
type Where uint8

const (
	InDriver   Where = 1 << iota // the driver's config.lock block
	InFileLock                   // the lock block of lock's -config file
	InFileTop                    // the top level of lock's -config file
	InFlags                      // a flag of lock (LockSetting.Flag)
)

// Kind is the type of a lock setting's value.
type Kind int

const (
	KindString Kind = iota
	KindDuration
	KindSignal
	KindInt
	KindBool
)

// LockSetting declares one lock setting.
type LockSetting struct {
	// Name is the setting's HCL attribute: config.lock.<Name> in a jobspec,
	// lock.<Name> (or <Name>, InFileTop) in lock's -config file.
	Name string
	In   Where
	// Default is lock's default, as its help shows it ("" for none). The
	// driver takes the defaults of ttl and delay from its plugin config.
	Default string
	// Usage is lock's help for the flag; a word in backquotes names the
	// flag's argument (see flag.UnquoteUsage).
	Usage string
	// Min is the least value of a duration setting (0: no minimum). Below
	// it the root supervisor would busy-loop against Nomad.
	Min time.Duration
	// ZeroOff makes a written 0 mean "off" (DurationOff) instead of the
	// default; the setting's Config field then holds DurationOff.
	ZeroOff bool
	// FlagName is the flag's name where it is not the Name's (see Flag).
	FlagName string
	// field is the Config field the setting sets: a *string, *int, *bool,
	// *time.Duration or *syscall.Signal.
	field func(*Config) any
}

// LockSpec is a list of lock settings.
type LockSpec []LockSetting

// LockSettings declares every lock setting once: its name, where it may be
// written, its default and its doc. The driver derives its config.lock block
// and the block's decoding from it; lock its flags, the lock settings of its
// -config file and their help. Apply parses them all the same way.
var LockSettings = LockSpec{
	{Name: "path", In: InDriver | InFileLock,
		Usage: "the Nomad Variable that holds the lock (lock: the first argument; " +
			"the driver's default: nomad/jobs/<job>/<group>/<task>/lock)",
		field: func(c *Config) any { return &c.Path }},
	{Name: "namespace", In: InFileLock | InFlags,
		Usage: "the lock variable's `namespace` (default: the task's)",
		field: func(c *Config) any { return &c.Namespace }},
	{Name: "holders", In: InDriver | InFileLock | InFlags, FlagName: "n",
		Usage: "at most `N` holders at once: a semaphore of N slots under the path, each a lock at <path>/slot-<i>; " +
			"the workload gets its slot (0 to N-1) in NOMAD_LOCK_SLOT; 0 is one lock at the path (see docs/semaphore.md)",
		field: func(c *Config) any { return &c.Holders }},
	{Name: "ttl", In: InDriver | InFileLock | InFlags, Default: DefaultTTL.String(),
		Usage: "lock TTL, 10s to 24h",
		field: func(c *Config) any { return &c.TTL }},
	{Name: "delay", In: InDriver | InFileLock | InFlags, Default: DefaultLockDelay.String(), Min: 100 * time.Millisecond,
		Usage: "lock delay after an unclean loss, at least 100ms; nomad var lock's default is 15s",
		field: func(c *Config) any { return &c.LockDelay }},
	{Name: "renew", In: InDriver | InFileLock | InFlags, Default: "TTL/2", Min: time.Second,
		Usage: "renew interval, at least 1s and below the TTL less the fence margin",
		field: func(c *Config) any { return &c.Renew }},
	{Name: "wait", In: InDriver | InFileLock | InFlags,
		Usage: "give up (exit 75) if the lock is not acquired within this time; 0 waits forever",
		field: func(c *Config) any { return &c.Wait }},
	{Name: "update_grace", In: InDriver | InFileLock | InFlags, Default: DefaultUpdateGrace.String(), Min: time.Second, ZeroOff: true,
		Usage: "in a rolling update, how long a standby of an older job version lets a newer one take a lock that came free " +
			"before it takes it itself, at least 1s; 0 turns the rule off (needs read-job; docs/updates.md)",
		field: func(c *Config) any { return &c.UpdateGrace }},
	{Name: "backoff", In: InFileLock | InFlags, Default: DefaultMaxBackoff.String(), Min: 100 * time.Millisecond,
		Usage: "cap of the jittered backoff after API errors, at least 100ms",
		field: func(c *Config) any { return &c.Backoff }},
	{Name: "max_retry", In: InFileLock | InFlags,
		Usage: "give up waiting after N consecutive API errors; 0 retries until -wait ends",
		field: func(c *Config) any { return &c.MaxRetry }},
	{Name: "early_return", In: InFileLock | InFlags,
		Usage: "try once; if the lock is held, exit 0 without running the command",
		field: func(c *Config) any { return &c.EarlyReturn }},
	{Name: "upstream_port", In: InFileLock | InFlags,
		Usage: "record the host:port of this Nomad port `label` as the holder's upstream in the lock, " +
			`for a "lock lb follow" sidecar: the next holder's ADD then removes it from the LB even if this instance dies`,
		field: func(c *Config) any { return &c.UpstreamPort }},
	{Name: "mode", In: InDriver | InFileLock | InFlags, Default: ModeLock,
		Usage: "the lock `mode`: " + `"lock" (the Nomad lock alone) or "lease": the lock plus a heartbeat every lease_interval, a self-fence ` +
			"lease_fence after the last acknowledged one, and a standby's plugin that releases a dead holder's lock after " +
			"L = lease_fence + lease_kill_grace + 1s (needs the plugin's release_token_file and the lease policy; docs/lease.md). " +
			"lock: only the holder half; a standby takes over fast only if a singleton task waits for the same lock, " +
			"else once the server expires the lock (docs/cli.md)",
		field: func(c *Config) any { return &c.Mode }},
	{Name: "lease_profile", In: InDriver | InFileLock | InFlags, Default: ProfileDefault,
		Usage: "lease mode's timings, a `profile`: " + `"default" (lease_interval 1s, lease_fence 6s, lease_kill_grace 2s: L = 9s) or ` +
			`"aggressive" (500ms, 2s, 1s: L = 4s; its cost: any outage of the heartbeat's Raft writes longer than 2s, ` +
			"such as most Nomad leader elections, fences the holder); the lease_* settings override it",
		field: func(c *Config) any { return &c.LeaseProfile }},
	{Name: "lease_interval", In: InDriver | InFileLock | InFlags, Default: "the profile's", Min: lockclient.MinHeartbeatInterval,
		Usage: "lease mode: the time between heartbeats (R), at least 250ms; each is one Raft write",
		field: func(c *Config) any { return &c.LeaseInterval }},
	{Name: "lease_fence", In: InDriver | InFileLock | InFlags, Default: "the profile's", Min: 500 * time.Millisecond,
		Usage: "lease mode: the holder fences itself this long (D) after the send of its last acknowledged heartbeat; " +
			"at least twice lease_interval, below the TTL less the fence margin",
		field: func(c *Config) any { return &c.LeaseFence }},
	{Name: "lease_kill_grace", In: InDriver | InFileLock | InFlags, Default: "the profile's", Min: 100 * time.Millisecond,
		Usage: "lease mode: after a heartbeat fence the workload gets kill_signal and is SIGKILLed this long (K) later at most",
		field: func(c *Config) any { return &c.LeaseKillGrace }},
	{Name: "kill_signal", In: InDriver | InFileTop | InFlags, Default: "SIGTERM",
		Usage: "signal for the workload's process group on loss or stop; " +
			"unless set, a SIGTERM or SIGINT sent to lock is passed on as is",
		field: func(c *Config) any { return &c.KillSignal }},
	{Name: "kill_timeout", In: InDriver | InFileTop | InFlags, Default: DefaultKillTimeout.String(),
		Usage: "grace before SIGKILL; keep it below the task's kill_timeout",
		field: func(c *Config) any { return &c.KillTimeout }},
	{Name: "http_addr", In: InFileTop | InFlags,
		Usage: "serve /metrics (Prometheus) and /holder (200 with the lock's path, fence and holding time while this process " +
			"holds the lock, 503 otherwise) on this `host:port`, e.g. 127.0.0.1:9465 or ${NOMAD_ADDR_metrics} (see docs/operations.md)",
		field: func(c *Config) any { return &c.HTTPAddr }},
}

// DurationOff is the value of a ZeroOff setting written as 0: off.
const DurationOff time.Duration = -1

// checkMin refuses a duration below the setting's minimum. Zero is left to
// Config.Validate: it means the default, or Nomad's own reading of 0 (delay).
func (s LockSetting) checkMin(label string, d time.Duration) error {
	if s.Min > 0 && d != 0 && d < s.Min {
		return fmt.Errorf("%s = %s is below its minimum of %s", label, d, s.Min)
	}
	return nil
}

// CheckMin refuses a duration d, given for the setting named name (as
// label: a plugin config default), below that setting's minimum.
func (spec LockSpec) CheckMin(name string, d time.Duration, label string) error {
	for _, s := range spec {
		if s.Name == name {
			return s.checkMin(label, d)
		}
	}
	panic("no lock setting " + name)
}

// Flag is the setting's flag name: its Name with dashes.
func (s LockSetting) Flag() string {
	if s.FlagName != "" {
		return s.FlagName
	}
	return strings.ReplaceAll(s.Name, "_", "-")
}

// Kind is the type of the setting's value.
func (s LockSetting) Kind() Kind {
	switch s.field(&Config{}).(type) {
	case *time.Duration:
		return KindDuration
	case *syscall.Signal:
		return KindSignal
	case *int:
		return KindInt
	case *bool:
		return KindBool
	}
	return KindString
}

// In is the settings that may be written at w.
func (spec LockSpec) In(w Where) LockSpec {
	var out LockSpec
	for _, s := range spec {
		if s.In&w != 0 {
			out = append(out, s)
		}
	}
	return out
}

// LockValues are lock settings as a user wrote them, by Name. A missing
// value leaves the setting as it is, and so does an empty one, but for a
// string setting, which it empties (-namespace "" over a -config file's).
type LockValues map[string]string

// Apply sets in c each of spec's settings that vals gives. label names a
// setting as the user wrote it (config.lock.ttl, -ttl, a file's lock.ttl);
// every error names it.
func (spec LockSpec) Apply(c *Config, vals LockValues, label func(LockSetting) string) error {
	var errs []error
	for _, s := range spec {
		v, ok := vals[s.Name]
		if !ok || (v == "" && s.Kind() != KindString) {
			continue
		}
		if err := s.set(c, v, label(s)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s LockSetting) set(c *Config, v, label string) error {
	switch dst := s.field(c).(type) {
	case *string:
		*dst = v
	case *time.Duration:
		if err := ParseDuration(label, v, "10s", dst); err != nil {
			return err
		}
		if *dst == 0 && s.ZeroOff {
			*dst = DurationOff
			return nil
		}
		return s.checkMin(label, *dst)
	case *syscall.Signal: // kill_signal, the only one
		sig, err := ParseSignal(v)
		*dst, c.KillSignalSet = sig, true
		if err != nil {
			return fmt.Errorf("%s: %w", label, err)
		}
	case *int:
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%s = %q is not a whole number", label, v)
		}
		*dst = n
	case *bool:
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%s = %q is not true or false", label, v)
		}
		*dst = b
	}
	return nil
}
