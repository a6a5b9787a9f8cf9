package harness

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// Die kills a client in a network namespace of its own (AgentOptions.Netns)
// as its node dies: every process in that namespace (the agent, the plugin
// and everything they started: supervisors, guards, workloads, logmons) is
// SIGSTOPped, pass after pass until none is left running, so that none can
// react to another's death; then each is SIGKILLed and the agent reaped. It
// returns when the freeze began (CLOCK_MONOTONIC ns) and the processes.
// Start brings the node back with its data dir.
func (m *Member) Die() (int64, []int, error) {
	agent := m.PID()
	if agent == 0 {
		return 0, nil, fmt.Errorf("%s is not running", m.name)
	}
	ns, err := os.Readlink("/proc/" + strconv.Itoa(agent) + "/ns/net")
	if err != nil {
		return 0, nil, fmt.Errorf("%s: network namespace of agent %d: %w", m.name, agent, err)
	}
	if self, _ := os.Readlink("/proc/self/ns/net"); ns == self {
		return 0, nil, errors.New(m.name + " runs in the caller's own network namespace: it cannot die alone (AgentOptions.Netns)")
	}
	at := MonoNow()
	stopped := map[int]bool{}
	for pass := 0; pass < 10; pass++ {
		fresh := 0
		for _, pid := range NetnsPIDs(ns) {
			if !stopped[pid] {
				_ = syscall.Kill(pid, syscall.SIGSTOP)
				stopped[pid] = true
				fresh++
			}
		}
		if fresh == 0 {
			break
		}
	}
	var pids []int
	for pid := range stopped {
		pids = append(pids, pid)
		if pid != agent {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return at, pids, m.Kill()
}

// NetnsPIDs lists the processes (other than the caller) whose network
// namespace is ns (a /proc/<pid>/ns/net link such as "net:[4026532]").
func NetnsPIDs(ns string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if l, err := os.Readlink("/proc/" + e.Name() + "/ns/net"); err == nil && l == ns {
			out = append(out, pid)
		}
	}
	return out
}
