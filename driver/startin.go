package driver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/client/lib/cgroupslib"
)

// The supervisor stays out of the task cgroup, so the cgroup holds the
// workload's processes and nothing else (the proof of death kills the whole
// cgroup) and a memory-cgroup OOM kill cannot pick the supervisor. The
// workload must still be born inside it: a process that forked before it
// was moved would leave children behind outside. So the supervisor joins
// the task cgroup just around the fork, and leaves again at once: the child
// inherits the cgroups at fork, and Go's exec drops it to the task user,
// changes into its work dir, and sets its parent-death signal in the child
// before the command runs. Nothing else forks from the supervisor meanwhile
// (the guard is already running), and the cgroup is empty then.

// taskStarter places the supervisor in the task cgroup for one start.
type taskStarter struct {
	join []string // the task cgroup's cgroup.procs files
	back []string // ours, to return to
	// oomAdj is the workload's oom_score_adj, ours meanwhile (it is
	// inherited at fork); own is ours to restore.
	oomAdj, own int
	// workDir is a work_dir the job chose ("" for the task dir): a failed
	// start may be the task user's lack of access to it.
	workDir string
	log     hclog.Logger
}

// newTaskStarter records where the supervisor is now, for each of the task's
// cgroup.procs files.
func newTaskStarter(spec supervisorSpec, log hclog.Logger) (*taskStarter, error) {
	own, err := readOOMScoreAdj()
	if err != nil {
		return nil, err
	}
	ts := &taskStarter{join: spec.CgroupProcs, oomAdj: spec.OOMScoreAdj, own: own, log: log}
	if cwd, err := os.Getwd(); err == nil && spec.WorkDir != "" && spec.WorkDir != cwd {
		ts.workDir = spec.WorkDir
	}
	if len(spec.CgroupProcs) == 0 {
		return ts, nil
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	for _, f := range spec.CgroupProcs {
		back, err := ownProcsFile(self, f, cgroupslib.Mode(spec.CgroupMode))
		if err != nil {
			return nil, err
		}
		ts.back = append(ts.back, back)
	}
	return ts, nil
}

// ownProcsFile is the cgroup.procs file of our own cgroup in the hierarchy
// of the task's procsFile (/sys/fs/cgroup/<controller>/... on v1).
func ownProcsFile(selfCgroup []byte, procsFile string, mode cgroupslib.Mode) (string, error) {
	root := cgroupslib.GetDefaultRoot()
	rel, err := filepath.Rel(root, procsFile)
	if err != nil || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("task cgroup file %s is not below %s", procsFile, root)
	}
	controller := ""
	if mode == cgroupslib.CG1 {
		controller, _, _ = strings.Cut(rel, string(filepath.Separator))
	}
	sc := bufio.NewScanner(bytes.NewReader(selfCgroup))
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if mode != cgroupslib.CG1 {
			if parts[0] == "0" && parts[1] == "" {
				return filepath.Join(root, parts[2], "cgroup.procs"), nil
			}
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == controller {
				return filepath.Join(root, controller, parts[2], "cgroup.procs"), nil
			}
		}
	}
	return "", fmt.Errorf("no %q cgroup in /proc/self/cgroup for %s", controller, procsFile)
}

// within runs start inside the task cgroup with the workload's
// oom_score_adj, then returns the supervisor to where it was. If it cannot
// leave, it must not stay: the proof of death freezes and kills the task
// cgroup, so the supervisor exits at once (its group guard kills the
// workload, and the plugin's crash path proves the task dead and releases).
func (ts *taskStarter) within(start func() error) error {
	if err := ts.adjust(ts.oomAdj); err != nil {
		return fmt.Errorf("set the workload's oom_score_adj to config.oom_score_adj = %d: %w", ts.oomAdj, err)
	}
	if err := joinCgroups(ts.join); err != nil {
		ts.leave()
		return fmt.Errorf("join the task cgroup: %w", err)
	}
	err := start()
	ts.leave()
	if err != nil && ts.workDir != "" && (errors.Is(err, os.ErrPermission) || errors.Is(err, os.ErrNotExist)) {
		err = fmt.Errorf("%w (check config.work_dir: the task user may not be able to enter %s)", err, ts.workDir)
	}
	return err
}

func (ts *taskStarter) leave() {
	if err := errors.Join(joinCgroups(ts.back), ts.adjust(ts.own)); err != nil {
		ts.log.Error("cannot leave the task cgroup after starting the workload; exiting", "error", err)
		os.Exit(1)
	}
}

// adjust sets our oom_score_adj to v unless it is that already (lowering it
// needs CAP_SYS_RESOURCE, which some sandboxes withhold even from root).
func (ts *taskStarter) adjust(v int) error {
	if cur, err := readOOMScoreAdj(); err == nil && cur == v {
		return nil
	}
	return setOOMScoreAdj(v)
}

func readOOMScoreAdj() (int, error) {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
