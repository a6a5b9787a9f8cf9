package e2e

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/harness"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/procfs"
)

// Every job and plain run in this file uses the same lease timing.
const (
	lockTTL   = "10s"
	lockDelay = "1s"
	// taskName is the task of every group in the jobs below.
	taskName = "t"
)

// scenario names the things one scenario owns, so that scenarios sharing an
// agent never see each other's jobs, locks, processes or records.
type scenario struct {
	job    string // job ID
	path   string // lock variable path
	marker string // in every workload's argv: FindProcs and Sampler select by it
	record string // the testworkload record file
}

func newScenario(t *testing.T, name string) scenario {
	job := "lock-" + name
	return scenario{
		job:    job,
		path:   "nomad/jobs/" + job + "/lock",
		marker: fmt.Sprintf("%s-%d", job, time.Now().UnixNano()),
		record: filepath.Join(t.TempDir(), "records.jsonl"),
	}
}

// lockArgs are `lock` flags with the common timing, then extra flags, then the path.
func lockArgs(path string, extra ...string) []string {
	args := []string{"-ttl", lockTTL, "-delay", lockDelay}
	args = append(args, extra...)
	return append(args, path)
}

// workloadArgv is the testworkload command line writing to the scenario's
// record file, carrying its marker, with extra flags appended.
func (s scenario) workloadArgv(t *testing.T, extra ...string) []string {
	argv := []string{harness.BuildTestWorkload(t), "-record", s.record, "-marker", s.marker}
	return append(argv, extra...)
}

// group is one task group of a test job: one task named taskName.
type group struct {
	name  string // default "g"
	count int    // default 1
	// failFast: no task restart and no reschedule, so one run is the whole story.
	failFast bool
	driver   string // default raw_exec
	command  string
	args     []string
	env      map[string]string
	// identityFile also writes the workload identity to secrets/nomad_token.
	identityFile bool
	volumes      []volume // host volumes mounted into the task (exec driver)
	// extra is group-level HCL added verbatim, e.g. a disconnect {} block.
	extra string
}

// volume mounts a client host volume (named as in AgentOptions.HostVolumes).
type volume struct {
	name, dest string
	writable   bool
}

// jobHCL renders a job of type typ ("service" or "batch") with the groups,
// with harness/jobs/lock.nomad.hcl.tmpl. Every task has
// `identity { env = true }` and kill_timeout 6s, above lock's default
// -kill-timeout of 4s.
func jobHCL(id, typ string, groups ...group) string {
	type volumeSpec struct {
		Name, Dest string
		ReadOnly   bool
	}
	type groupSpec struct {
		Name, Extra, Task, Driver, Command string
		Count                              int
		FailFast, IdentityFile             bool
		Volumes                            []volumeSpec
		Env                                map[string]string
		Args                               []string
	}
	specs := make([]groupSpec, len(groups))
	for i, g := range groups {
		s := groupSpec{Name: cmp.Or(g.name, "g"), Extra: g.extra, Task: taskName, Driver: cmp.Or(g.driver, "raw_exec"),
			Command: g.command, Count: cmp.Or(g.count, 1), FailFast: g.failFast, IdentityFile: g.identityFile,
			Env: g.env, Args: g.args}
		for _, v := range g.volumes {
			s.Volumes = append(s.Volumes, volumeSpec{Name: v.name, Dest: v.dest, ReadOnly: !v.writable})
		}
		specs[i] = s
	}
	return harness.Jobspec("lock", struct {
		ID, Type string
		Groups   []groupSpec
	}{id, typ, specs})
}

// lockGroup is a raw_exec group whose task runs `lock` around the scenario's
// testworkload.
func (s scenario) lockGroup(t *testing.T, count int, lockFlags, workloadFlags []string) group {
	args := lockArgs(s.path, lockFlags...)
	args = append(args, s.workloadArgv(t, workloadFlags...)...)
	return group{count: count, command: harness.LockBin(t), args: args}
}

// isMainStart matches a main-role start record.
func isMainStart(r harness.Record) bool {
	return r.Event == harness.EventStart && r.Role == harness.RoleMain
}

// waitMainStart waits for a main-role start record that also satisfies
// match (nil: any).
func waitMainStart(t *testing.T, record string, timeout time.Duration, match func(harness.Record) bool) harness.Record {
	t.Helper()
	return harness.WaitRecord(t, record, timeout, func(r harness.Record) bool {
		return isMainStart(r) && (match == nil || match(r))
	})
}

func readRecords(t *testing.T, record string) []harness.Record {
	t.Helper()
	recs, err := harness.ReadRecords(record)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// mainWorkloads returns the live main-role testworkloads carrying marker.
func mainWorkloads(t *testing.T, marker string) []harness.Proc {
	t.Helper()
	procs, err := harness.FindProcs(marker)
	if err != nil {
		t.Fatal(err)
	}
	var out []harness.Proc
	for _, p := range procs {
		if p.IsMainWorkload() {
			out = append(out, p)
		}
	}
	return out
}

// alive reports whether pid is a live process (not a zombie).
func alive(pid int) bool {
	stat, err := procfs.Read(pid)
	return err == nil && !stat.Gone()
}

// isLockExe reports whether the process runs a `lock` binary.
func isLockExe(p harness.Proc) bool {
	return filepath.Base(strings.TrimSuffix(p.Exe, " (deleted)")) == "lock"
}

// lockOf finds the `lock` process supervising the workload with host PID
// workloadPID: the workload's parent, running the lock binary.
func lockOf(t *testing.T, marker string, workloadPID int) (lock, workload harness.Proc) {
	t.Helper()
	procs, err := harness.FindProcs(marker)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(procs, func(p harness.Proc) bool { return p.PID == workloadPID })
	if i < 0 {
		t.Fatalf("workload pid %d not found among %v", workloadPID, procs)
	}
	workload = procs[i]
	j := slices.IndexFunc(procs, func(p harness.Proc) bool { return p.PID == workload.PPID })
	if j < 0 || !isLockExe(procs[j]) {
		t.Fatalf("the parent (pid %d) of workload %v is not a lock process: %v", workload.PPID, workload, procs)
	}
	return procs[j], workload
}

// readLock reads the lock variable through the management API (ACLs off, or
// the management token: the Lock field is visible).
func readLock(t *testing.T, a *harness.Agent, path string) *api.Variable {
	t.Helper()
	v, _, err := a.API().Variables().Read(path, nil)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return v
}

// waitReleased waits until the variable at path holds no lock.
func waitReleased(t *testing.T, a *harness.Agent, path string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v, _, err := a.API().Variables().Read(path, nil)
		if err == nil && (v.Lock == nil || v.Lock.ID == "") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock %s still held %s later: %+v (err %v)", path, timeout, v, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fence parses a NOMAD_LOCK_FENCE value.
func fence(t *testing.T, r harness.Record) uint64 {
	t.Helper()
	f, err := strconv.ParseUint(r.Fence, 10, 64)
	if err != nil {
		t.Fatalf("record of pid %d has no valid NOMAD_LOCK_FENCE (%q): %v", r.PID, r.Fence, err)
	}
	return f
}

// argsAfterDashDash is the part of a recorded argv after the first "--".
func argsAfterDashDash(argv []string) []string {
	i := slices.Index(argv, "--")
	if i < 0 {
		return nil
	}
	return argv[i+1:]
}

// startPlainLock runs bin/lock outside Nomad against the agent's HTTP API
// (NOMAD_ADDR), around argv.
func startPlainLock(t *testing.T, a *harness.Agent, flags []string, argv ...string) *harness.Process {
	t.Helper()
	cmd := exec.Command(harness.LockBin(t), append(flags, argv...)...)
	cmd.Env = append(harness.WithoutNomadEnv(os.Environ()), a.Env()...)
	return harness.StartProcess(t, cmd)
}

// runLock runs bin/lock (e.g. `lock status`) to completion and returns its
// exit code, stdout and stderr.
func runLock(t *testing.T, a *harness.Agent, args ...string) (int, string, string) {
	t.Helper()
	p := startPlainLock(t, a, args)
	code := p.Wait(30 * time.Second)
	return code, p.Stdout(), p.Stderr()
}

// runConcurrently runs each subtest in its own goroutine and waits for all.
// Unlike t.Parallel, this is not limited by -parallel: the scenarios share
// their parent's agent and spend nearly all their time waiting on TTLs and
// samplers. With -short, the subtests outside the smoke tier are skipped
// (harness.Smoke).
func runConcurrently(t *testing.T, subtests []subtest) {
	var wg sync.WaitGroup
	for _, st := range subtests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(st.name, func(t *testing.T) {
				harness.SkipOutsideSmoke(t)
				st.fn(t)
			})
		}()
	}
	wg.Wait()
}

type subtest struct {
	name string
	fn   func(t *testing.T)
}
