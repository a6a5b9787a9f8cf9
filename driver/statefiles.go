package driver

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/securefs"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/textclip"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// The plugin and the detached supervisor talk through files in the task's
// state directory, so either can restart without the other noticing:
//
//	spec.json     plugin → supervisor: what to run, and the LB auth key the plugin read for it
//	stop.json     plugin → supervisor: kill signal and timeout of a StopTask, announced by stopSignal
//	status.json   supervisor → plugin: current state and deadlines, for the watchdog
//	events.jsonl  supervisor → plugin: one line per state change, turned into task events
//	exit.json     supervisor → plugin: the exit code, for a plugin that is no longer the parent
//	lease.json    supervisor → plugin: the held lease and its lock ID, removed once released, so
//	              the plugin can release for a supervisor that died holding the lock
//	lb.json       supervisor → plugin: our LB registration, removed once deregistered, so the
//	              plugin can REMOVE for a supervisor that died registered
//	metrics.json  supervisor → plugin: the supervisor's metrics, when the plugin serves them
//
// Both sides run as root and act on these files (exec a command, signal a
// process, send a key), so they live where no task and no local user can
// write: <state_dir>/<alloc ID>/<task>, owned by root with mode 0700, checked
// at every open and read without following symlinks (internal/securefs).
// Never in the task dir, which Nomad makes 0777 and hands to the task user.
const (
	specFile    = "spec.json"
	stopFile    = "stop.json"
	statusFile  = "status.json"
	eventsFile  = "events.jsonl"
	offsetFile  = "events.offset"
	exitFile    = "exit.json"
	leaseFile   = "lease.json"
	lbFile      = "lb.json"
	maxFileSize = 1 << 20
)

// openTaskState opens (creating) the state dir of one task below the
// plugin's state_dir root.
func openTaskState(root *securefs.Dir, cfg *drivers.TaskConfig) (*securefs.Dir, error) {
	if !allocIDPattern.MatchString(cfg.AllocID) {
		return nil, fmt.Errorf("unexpected allocation ID %q", cfg.AllocID)
	}
	alloc, err := root.Sub(cfg.AllocID, true)
	if err != nil {
		return nil, err
	}
	defer alloc.Close()
	return alloc.Sub(url.PathEscape(strings.TrimPrefix(cfg.ID, cfg.AllocID+"/")), true)
}

// removeTaskState removes a task's state dir, and its alloc's once empty.
func removeTaskState(root *securefs.Dir, cfg *drivers.TaskConfig) error {
	alloc, err := root.Sub(cfg.AllocID, false)
	if err != nil {
		return nil // never made, or gone already
	}
	defer alloc.Close()
	if err := alloc.RemoveSub(url.PathEscape(strings.TrimPrefix(cfg.ID, cfg.AllocID+"/"))); err != nil {
		return err
	}
	_ = root.RemoveEmptySub(cfg.AllocID)
	return nil
}

// prepareStateDir empties the task's state dir (a restarted task may reuse
// it) and writes the spec.
func prepareStateDir(dir *securefs.Dir, spec supervisorSpec) error {
	for _, f := range []string{statusFile, eventsFile, offsetFile, exitFile, stopFile, leaseFile, lbFile, gatedFile, metricsFile} {
		if err := dir.Remove(f); err != nil {
			return err
		}
	}
	return writeJSON(dir, specFile, spec)
}

var allocIDPattern = regexp.MustCompile(`^[0-9a-fA-F-]{1,64}$`)

// supervisorSpec is everything the supervisor needs: the run, whole, as
// package shim reads it (Run), and where and as whom its workload runs.
// The plugin writes it once, at the task's start; its version (Run's) is
// recorded in the task's driverState too, so that a later plugin reads it
// (readSpec), or refuses it naming the way out.
type supervisorSpec struct {
	// Run is the supervised run: the lock settings and the workload, a
	// gate's own task or an on-lock task's watch of its allocation, the
	// lock's holder record (the task as Nomad's task config names it:
	// never from the task environment, whose NOMAD_ALLOC_ID and the like
	// the job's env block can override; the next gate waits for the
	// allocation it names, and the LB request ids are made of it), and the
	// load balancer with its port labels resolved.
	Run    shim.Spec
	TaskID string
	// DockerEndpoint is, for a gate, the plugin config's docker_endpoint,
	// through which it kills its gated docker tasks ("" leaves them to
	// Nomad).
	DockerEndpoint string `json:",omitempty"`
	taskProcess
	// legacyLBReserve is lbRemoveReserve of a version 1 spec, whose run has
	// no resolved load balancer (decodeLegacySpec).
	legacyLBReserve time.Duration
}

// taskProcess is where and as whom the task's workload runs: the part of a
// task's spec that is the plugin's own, the same in every version of it.
type taskProcess struct {
	// CgroupProcs are the task cgroup's cgroup.procs files, which the
	// supervisor joins only around the workload's fork (see taskStarter),
	// and the exec helper joins for `nomad alloc exec`. CgroupMode and CgroupPath name the cgroup that proves the
	// workload dead (v1: the freezer cgroup; v2: the task's cgroup); an
	// empty CgroupPath means there is none.
	CgroupProcs []string
	CgroupMode  int
	CgroupPath  string
	WorkDir     string
	// UID/GID/Groups run the workload as the task's user; nil runs it as root.
	UID    *uint32
	GID    uint32
	Groups []uint32
	// ShareNomadToken leaves NOMAD_TOKEN in the workload's environment.
	ShareNomadToken bool
	// DeniedEnvvars are glob patterns of variables removed from the
	// workload's environment (plugin's and task's denied_envvars).
	DeniedEnvvars []string
	// OOMScoreAdj is the workload's oom_score_adj (the supervisor's own is
	// supervisorOOMScoreAdj, which the workload must not inherit).
	OOMScoreAdj int
	// OOMKillsAtStart is the task memory cgroup's OOM kill count before the
	// supervisor started; nil when it could not be read. A higher count at
	// exit means the kernel OOM-killed a workload process.
	OOMKillsAtStart *uint64
	// Metrics: the plugin serves metrics (metrics_addr), so the supervisor
	// writes its own to metrics.json.
	Metrics bool `json:",omitempty"`
}

// supervisorStatus is the supervisor's latest state. Times are
// CLOCK_BOOTTIME nanoseconds (lockclient.BootNanos): the plugin on the same
// host compares them with its own reading, immune to wall-clock steps, and,
// like the server's lock timers, counting the time the host was suspended.
type supervisorStatus struct {
	State             string
	Message           string
	Path              string
	Fence             uint64
	FenceDeadlineBoot int64
	StopDeadlineBoot  int64
	// LastRenewBoot is when the last acknowledged renew of the lease (or
	// its acquire) was sent: the plugin's crash release leaves the lock to
	// expire from its release cutoff on.
	LastRenewBoot int64 `json:",omitempty"`
	WorkloadPID   int
	WorkloadPGID  int
	SupervisorPID int
	// SupervisorTicks is the supervisor's start time (clock ticks since
	// boot, /proc/<pid>/stat): with SupervisorPID it proves the process is
	// still the supervisor (findSupervisor).
	SupervisorTicks uint64 `json:",omitempty"`
	UpdatedBoot     int64
}

// maxEventMessage bounds the message of every task event and of the
// status and exit files: task events are stored in Nomad's Raft log, and the
// plugin reads those files with a cap (maxFileSize); a status it cannot read
// would leave the watchdog acting on stale deadlines. The LB's text is
// bounded where it enters (lbhook.MaxLBText); this is the backstop for
// whatever else a message carries.
const maxEventMessage = 2048

// maxHolderID bounds the holder_alloc_id annotation of a task event.
const maxHolderID = 64

// eventMessage is msg bounded to maxEventMessage, its cut marked.
func eventMessage(msg string) string { return textclip.Clip(msg, maxEventMessage) }

// taskEventLine is one line of events.jsonl.
type taskEventLine struct {
	Time    time.Time
	State   string
	Message string
	Holder  string `json:",omitempty"`
	Fence   uint64 `json:",omitempty"`
}

// heldLease is what the plugin needs to release a crashed supervisor's lock.
type heldLease struct {
	LockID    string
	Path      string
	Namespace string
	Fence     uint64
	TTL       time.Duration
	LockDelay time.Duration
	// LastRenewBoot is when the acquire was sent (CLOCK_BOOTTIME ns);
	// status.json carries the later renews (see lastRenew).
	LastRenewBoot int64 `json:",omitempty"`
	// IdentityRejected: the supervisor proved its workload dead and tried
	// to release, but the task's identity no longer authenticates (a
	// purged job): the plugin releases with its release_token_file.
	IdentityRejected bool `json:",omitempty"`
}

// lbRegistration is what the plugin needs to take a crashed supervisor's
// upstream out of the load balancer.
type lbRegistration struct {
	Config   lbhook.Config
	AllocID  string
	Fence    uint64
	Upstream lbhook.UpstreamInfo
}

// exitStatus is the supervisor's exit, written just before it exits.
type exitStatus struct {
	ExitCode int
	Signal   int
	Message  string `json:",omitempty"`
	// OOMKilled: the task's memory cgroup OOM-killed a workload process.
	OOMKilled bool `json:",omitempty"`
}

// wroteExitStatus reports whether the supervisor recorded its exit, which
// it does after its own stop path: a supervisor that died without one crashed.
func wroteExitStatus(dir *securefs.Dir) bool {
	var es exitStatus
	return readJSON(dir, exitFile, &es) == nil
}

// stopSignal tells the supervisor that stop.json holds a StopTask request. A
// real-time signal that no user sends by accident and that is never forwarded.
const stopSignal = syscall.Signal(51)

// stopRequest is a StopTask's kill signal and timeout.
type stopRequest struct {
	Signal  int
	Timeout time.Duration
}

// bootNow is CLOCK_BOOTTIME in nanoseconds, shared by every process on the
// host, and counting the time it was suspended.
func bootNow() int64 { return lockclient.BootNanos(lockclient.BootNow()) }

// lastRenew is when the last acknowledged renew of held's lease was sent,
// on lockclient's clock: the later of the lease record's (the acquire) and
// the status's, if that is of the same lease. Zero when unknown (a record
// of an older version): the lease is then left to expire.
func lastRenew(held heldLease, st supervisorStatus) time.Time {
	ns := held.LastRenewBoot
	if ns != 0 && st.Fence == held.Fence && st.LastRenewBoot > ns {
		ns = st.LastRenewBoot
	}
	return lockclient.BootTime(ns)
}

// writeJSON replaces name in dir atomically, so a reader never sees half a file.
func writeJSON(dir *securefs.Dir, name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return dir.WriteFile(name, b)
}

func readJSON(dir *securefs.Dir, name string, v any) error {
	b, err := dir.ReadFile(name, maxFileSize)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s: %w", name, err)
	}
	return nil
}

func appendJSONLine(dir *securefs.Dir, name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return dir.AppendFile(name, append(b, '\n'))
}

// eventTail reads the lines appended to events.jsonl since the last call.
// The plugin records how far it has emitted events, so a restarted plugin
// emits what happened while it was down, and nothing twice.
type eventTail struct {
	dir    *securefs.Dir
	offset int64
}

func (t *eventTail) save() {
	_ = writeJSON(t.dir, offsetFile, t.offset)
}

func (t *eventTail) restore() {
	_ = readJSON(t.dir, offsetFile, &t.offset)
}

func (t *eventTail) read() ([]taskEventLine, error) {
	f, err := t.dir.Open(eventsFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(t.offset, io.SeekStart); err != nil {
		return nil, err
	}
	var out []taskEventLine
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			break // a partial last line is read again next time
		}
		t.offset += int64(len(line))
		var ev taskEventLine
		if json.Unmarshal(line, &ev) == nil {
			out = append(out, ev)
		}
	}
	return out, nil
}
