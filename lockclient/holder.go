package lockclient

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"time"
)

// Holder describes who holds (or held) the lock. It is written into the
// variable's Items on acquire, so waiters, `lock status` and the next holder
// can read it without seeing the lock ID.
type Holder struct {
	AllocID  string
	JobID    string
	Group    string
	Task     string
	Node     string // Nomad node name, else the host name
	Hostname string
	PID      int
	// Upstream is the host:port the holder registers with the load balancer.
	Upstream string
	// PreviousUpstream is the upstream of the holder before this one, copied
	// at acquire, so an LB hook outside the supervisor (`lock lb follow`)
	// can swap it out.
	PreviousUpstream string
	AcquiredAt       time.Time
	TTL              time.Duration
	LockDelay        time.Duration
	// ReleasedClean is written by a holder just before it releases, once
	// it has proven its work dead (Lease.MarkReleasedClean). A lock freed
	// without it was released behind its holder's back or expired.
	ReleasedClean bool
	// ReleasedAt is written right after a release (Locker.ReleaseID), by
	// check-and-set on the index the release left: a record that shows it
	// is of a lock that nobody has taken since. Zero: not released, or
	// released by someone who does not write it (the server's expiry).
	ReleasedAt time.Time
	// Holders is the N of the semaphore whose slot this is (0: a plain
	// lock), and Slot the slot's number, 0 to N-1 (Config.Holders).
	Holders int
	Slot    int
	// StepDown says how this holder steps down at an operator's request
	// (stepdown.go): "" not at all (a build without it, or an identity
	// that may not read the request), StepDownStop or StepDownRestart;
	// StepDownWithin bounds how long its stop takes once it begins. Its
	// step-down hook writes them (StepDownItems); they are read only.
	StepDown       StepDownMode
	StepDownWithin time.Duration
	// Handover is written by a holder that stepped down, just before its
	// release (Lease.MarkSteppingDown): whom the standbys give way to, and
	// until when. Read only.
	Handover Handover
}

// Items keys. They are part of our on-Nomad format: keep them stable.
// Callers add items of their own (AcquireOptions.Items), which lockclient
// writes and reads back as they are.
const (
	itemAlloc      = "holder_alloc_id"
	itemJob        = "holder_job_id"
	itemGroup      = "holder_group"
	itemTask       = "holder_task"
	itemNode       = "holder_node"
	itemHostname   = "holder_hostname"
	itemPID        = "holder_pid"
	itemUpstream   = "holder_upstream"
	itemPrevious   = "previous_upstream"
	itemAcquiredAt = "acquired_at"
	itemTTL        = "ttl"
	itemLockDelay  = "lock_delay"
	itemClean      = "released_clean"
	itemReleasedAt = "released_at"
	itemHolders    = "semaphore_holders"
	itemSlot       = "semaphore_slot"
	itemStepDown   = "step_down"
	itemStepWithin = "step_down_within"
	itemDownFrom   = "step_down_from"
	itemDownTo     = "step_down_to"
	itemDownUntil  = "step_down_until"
)

// HolderFromEnv fills a Holder from the task environment Nomad sets.
func HolderFromEnv(getenv func(string) string) Holder {
	host, _ := os.Hostname()
	node := getenv("NOMAD_NODE_NAME")
	if node == "" {
		node = host
	}
	job := getenv("NOMAD_JOB_PARENT_ID")
	if job == "" {
		job = getenv("NOMAD_JOB_ID")
	}
	return Holder{
		AllocID:  getenv("NOMAD_ALLOC_ID"),
		JobID:    job,
		Group:    getenv("NOMAD_GROUP_NAME"),
		Task:     getenv("NOMAD_TASK_NAME"),
		Node:     node,
		Hostname: host,
		PID:      os.Getpid(),
	}
}

func (h Holder) items() map[string]string {
	m := map[string]string{
		itemAcquiredAt: h.AcquiredAt.UTC().Format(time.RFC3339Nano),
		itemTTL:        h.TTL.String(),
		itemLockDelay:  h.LockDelay.String(),
		itemPID:        strconv.Itoa(h.PID),
	}
	if h.Holders > 0 {
		m[itemHolders] = strconv.Itoa(h.Holders)
		m[itemSlot] = strconv.Itoa(h.Slot)
	}
	for k, v := range map[string]string{
		itemAlloc: h.AllocID, itemJob: h.JobID, itemGroup: h.Group, itemTask: h.Task,
		itemNode: h.Node, itemHostname: h.Hostname, itemUpstream: h.Upstream, itemPrevious: h.PreviousUpstream,
	} {
		if v != "" {
			m[k] = v
		}
	}
	return m
}

// holderFromItems reads what items() wrote. Unknown or missing keys leave zero values.
func holderFromItems(items map[string]string) Holder {
	h := Holder{
		AllocID:          items[itemAlloc],
		JobID:            items[itemJob],
		Group:            items[itemGroup],
		Task:             items[itemTask],
		Node:             items[itemNode],
		Hostname:         items[itemHostname],
		Upstream:         items[itemUpstream],
		PreviousUpstream: items[itemPrevious],
	}
	h.PID, _ = strconv.Atoi(items[itemPID])
	h.AcquiredAt, _ = time.Parse(time.RFC3339Nano, items[itemAcquiredAt])
	h.TTL, _ = time.ParseDuration(items[itemTTL])
	h.LockDelay, _ = time.ParseDuration(items[itemLockDelay])
	h.ReleasedClean = items[itemClean] == "true"
	h.ReleasedAt, _ = time.Parse(time.RFC3339Nano, items[itemReleasedAt])
	h.Holders, _ = strconv.Atoi(items[itemHolders])
	h.Slot, _ = strconv.Atoi(items[itemSlot])
	h.StepDown = StepDownMode(items[itemStepDown])
	h.StepDownWithin, _ = time.ParseDuration(items[itemStepWithin])
	h.Handover = handoverFromItems(items)
	return h
}

// Key names the holder among the standbys of its lock: its allocation
// ID, or for a holder outside Nomad its host and PID. It is a variable
// path segment (standby.go).
func (h Holder) Key() string {
	if h.AllocID != "" {
		return h.AllocID
	}
	return "host-" + unsafePathChars.ReplaceAllString(h.Hostname, "_") + "-" + strconv.Itoa(h.PID)
}

// unsafePathChars are the characters a variable path may not hold.
var unsafePathChars = regexp.MustCompile(`[^a-zA-Z0-9_~-]`)

// IsZero reports whether no holder was recorded.
func (h Holder) IsZero() bool { return h.AllocID == "" && h.Hostname == "" && h.PID == 0 }

// String is the short human form used in logs and task events.
func (h Holder) String() string {
	if h.IsZero() {
		return "an unknown holder"
	}
	who := "pid " + strconv.Itoa(h.PID)
	if h.AllocID != "" {
		who = "alloc " + shortID(h.AllocID)
	}
	where := h.Node
	if where == "" {
		where = h.Hostname
	}
	return fmt.Sprintf("%s on %s", who, where)
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
