package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/proctest"
)

// Process roles of an Agent.
const (
	roleDev    = "dev"
	roleServer = "server"
	roleClient = "client"
)

// Member is one `nomad agent` process of an Agent: the server, the client,
// or the single dev agent. Its ports, config and data dir are fixed for its
// life, so it can be stopped and started again.
type Member struct {
	a        *Agent
	role     string
	name     string // role, numbered for the second client on: client2, ...
	ip       string // the address it binds and advertises
	iface    string // the client's network_interface
	link     *nsLink
	dataDir  string
	cfgPath  string
	logPath  string
	httpPort int
	rpcPort  int
	serfPort int
	// dynamicPorts is a client's block of Nomad's dynamic port range
	// (dynamicBlock); zero: the whole range.
	dynamicPorts [2]int
	api          *api.Client

	mu     sync.Mutex
	nodeID string     // a client's node, once registered
	proc   *agentProc // latest run
	paused bool
	starts int
	pgids  []int // process group of every run: leftovers (e.g. logmon) keep it
}

// agentProc is one run of the agent binary.
type agentProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has been reaped
	err  error         // exit status; read only after done is closed
}

func (p *agentProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Role is "server", "client" or "dev".
func (m *Member) Role() string { return m.role }

// Name is the role, numbered from the second client on ("client2", ...).
func (m *Member) Name() string { return m.name }

// Addr is the process's HTTP address, e.g. http://127.0.0.1:41234.
func (m *Member) Addr() string {
	scheme := "http"
	if m.a.opts.TLS != nil {
		scheme = "https"
	}
	return fmt.Sprintf("%s://%s:%d", scheme, m.ip, m.httpPort)
}

// RPCAddr is the process's RPC address (host:port); servers listen on it.
func (m *Member) RPCAddr() string { return fmt.Sprintf("%s:%d", m.ip, m.rpcPort) }

// NodeID is a client's node ID once it has registered ("" before, and for a
// server). It survives restarts.
func (m *Member) NodeID() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.nodeID
}

// AllocDir is a client's alloc dir; <AllocDir>/<alloc id>/<task> is a task dir.
func (m *Member) AllocDir() string { return filepath.Join(m.dataDir, "alloc") }

// DataDir is the process's data dir. (A dev agent keeps no state, but its
// client's alloc dir is below it too.)
func (m *Member) DataDir() string { return m.dataDir }

// LogPath is the file that receives the process's stdout and stderr, across
// restarts. Each start is marked by a line beginning with "==== harness:".
func (m *Member) LogPath() string { return m.logPath }

// ConfigPath is the process's generated HCL configuration.
func (m *Member) ConfigPath() string { return m.cfgPath }

// API is an api client for this process's own HTTP API (with the management
// token if ACLs are on), e.g. for agent-local endpoints of the client.
func (m *Member) API() *api.Client { return m.api }

// PID of the running process, or 0.
func (m *Member) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil || m.proc.exited() {
		return 0
	}
	return m.proc.cmd.Process.Pid
}

// Running reports whether the process is alive (it may be paused).
func (m *Member) Running() bool { return m.PID() != 0 }

// Start starts the process (again) with the same config, ports and data dir,
// and waits (bounded by AgentOptions.StartTimeout) until it is ready.
func (m *Member) Start() error {
	a := m.a
	m.mu.Lock()
	if m.proc != nil && !m.proc.exited() {
		m.mu.Unlock()
		return errors.New(m.name + " agent is already running")
	}
	m.starts++
	n := m.starts
	m.mu.Unlock()

	// A restarted client must be seen to register again: its node record in
	// the server outlives it, still "ready" until the heartbeat TTL expires.
	var prevNodeIndex uint64
	if id := m.NodeID(); m.role == roleClient && id != "" {
		node, _, err := a.api.Nodes().Info(id, nil)
		if err != nil {
			return fmt.Errorf("read node before start: %w", err)
		}
		prevNodeIndex = node.ModifyIndex
	}

	args := []string{"agent", "-config=" + m.cfgPath}
	if m.role == roleDev {
		args = []string{"agent", "-dev", "-config=" + m.cfgPath}
	}
	if m.role != roleServer && a.opts.PluginDir != "" {
		args = append(args, "-plugin-dir="+a.opts.PluginDir)
	}
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "==== harness: %s start #%d at %s: %s %s\n", m.name, n,
		time.Now().Format(time.RFC3339Nano), a.bin, strings.Join(args, " "))

	cmd := exec.Command(a.bin, args...)
	if m.link != nil {
		// nsenter joins only the network namespace and execs the agent (same
		// PID). Not `ip netns exec`: it also remounts /sys in a mount
		// namespace of its own, hiding the cgroup hierarchy from the client.
		cmd = exec.Command("nsenter", append([]string{"--net=/run/netns/" + m.link.netns, "--", a.bin}, args...)...)
	}
	cmd.Dir = a.dir
	// NOMAD_* of the test process must not leak into raw_exec tasks.
	cmd.Env = append(filterEnv(os.Environ(), "NOMAD_"), a.opts.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group: a ^C to the test does not reach the agent twice,
	// and leftovers can be found by group. Pdeathsig: if the test binary
	// dies without cleanup (e.g. -timeout), the agent is told to shut down.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	began := time.Now()
	if err := proctest.StartPinned(cmd); err != nil {
		logf.Close()
		return fmt.Errorf("exec %s: %w", a.bin, err)
	}
	p := &agentProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	m.mu.Lock()
	m.proc, m.paused = p, false
	m.pgids = append(m.pgids, cmd.Process.Pid)
	m.mu.Unlock()

	if err := m.waitReady(p, began, prevNodeIndex); err != nil {
		return fmt.Errorf("%s agent: %w\n--- log tail (%s) ---\n%s", m.name, err, m.logPath, fileTail(m.logPath, 40))
	}
	a.log.Debug("agent process ready", "agent", m.name, "pid", cmd.Process.Pid, "start", n,
		"took", time.Since(began).Round(time.Millisecond))
	return nil
}

// Stop stops the process: SIGINT, up to AgentOptions.StopTimeout for a
// graceful exit, then SIGKILL, all by PID. A non-dev client leaves its tasks
// running (restart tests rely on it); a dev agent stops them. Stopping a
// stopped process is a no-op.
func (m *Member) Stop() error {
	m.mu.Lock()
	p, paused := m.proc, m.paused
	m.mu.Unlock()
	if p == nil || p.exited() {
		return nil
	}
	pid := p.cmd.Process.Pid
	if paused {
		if err := m.Resume(); err != nil {
			return err
		}
	}
	if err := syscall.Kill(pid, syscall.SIGINT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %s agent %d: %w", m.name, pid, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(m.a.opts.StopTimeout):
	}
	m.a.log.Warn("agent did not stop after SIGINT; sending SIGKILL", "agent", m.name, "pid", pid, "waited", m.a.opts.StopTimeout)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill %s agent %d: %w", m.name, pid, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s agent %d still not reaped 10s after SIGKILL", m.name, pid)
	}
}

// Kill kills the process with SIGKILL, as a crash would (no leave, no
// graceful shutdown), and waits until it is reaped. A non-dev client leaves
// its tasks running. Killing a stopped process is a no-op.
func (m *Member) Kill() error {
	m.mu.Lock()
	p := m.proc
	m.mu.Unlock()
	if p == nil || p.exited() {
		return nil
	}
	pid := p.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill %s agent %d: %w", m.name, pid, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s agent %d still not reaped 10s after SIGKILL", m.name, pid)
	}
}

// Restart stops and starts the process. Not supported in dev mode.
func (m *Member) Restart() error {
	if m.role == roleDev {
		return errors.New("a dev agent keeps no state and cannot be restarted")
	}
	if err := m.Stop(); err != nil {
		return err
	}
	return m.Start()
}

// Pause freezes the process with SIGSTOP and returns once every thread has
// stopped (its plugins, executors and tasks keep running). Cleanup resumes a
// paused process.
func (m *Member) Pause() error { return m.signalPaused(syscall.SIGSTOP, true) }

// Resume continues a paused process with SIGCONT and returns once it runs.
func (m *Member) Resume() error { return m.signalPaused(syscall.SIGCONT, false) }

func (m *Member) signalPaused(sig syscall.Signal, paused bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil || m.proc.exited() {
		return fmt.Errorf("%s: %w", m.name, errNotRunning)
	}
	pid := m.proc.cmd.Process.Pid
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("%v %s agent: %w", sig, m.name, err)
	}
	m.paused = paused
	// Signal delivery is asynchronous: wait until all threads agree.
	deadline := time.Now().Add(5 * time.Second)
	for allThreadsStopped(pid) != paused {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s agent %d: still not %s 5s after %v", m.name, pid,
				map[bool]string{true: "stopped", false: "running"}[paused], sig)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// allThreadsStopped reports whether every thread of pid is in state T
// (stopped by a signal). Threads that vanish meanwhile are ignored.
func allThreadsStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 || i+2 >= len(stat) {
			return false
		}
		if state := stat[i+2]; state != 'T' && state != 'Z' && state != 'X' { // exiting threads never stop
			return false
		}
	}
	return true
}

func (m *Member) isPaused() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.paused
}

// waitReady polls until the process is ready, exits, or the start times out.
func (m *Member) waitReady(p *agentProc, began time.Time, prevNodeIndex uint64) error {
	deadline := began.Add(m.a.opts.StartTimeout)
	var state string
	for {
		why := m.notReady(began, prevNodeIndex)
		if why == "" {
			return nil
		}
		if why != state {
			m.a.log.Debug("waiting for agent", "agent", m.name, "state", why, "after", time.Since(began).Round(time.Millisecond))
		}
		state = why
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %s", time.Since(began).Round(time.Millisecond), state)
		}
		select {
		case <-p.done:
			return fmt.Errorf("exited during start (%v); last state: %s", p.err, state)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// execFingerprintGrace is how long readiness waits for the exec driver to
// report at all (healthy or not) before giving up on it.
const execFingerprintGrace = 15 * time.Second

// notReady checks the readiness conditions once and returns what is missing,
// or "" when ready.
func (m *Member) notReady(began time.Time, prevNodeIndex uint64) string {
	a := m.a
	if m.role != roleClient {
		cl := a.api
		if m.role == roleServer {
			cl = m.api // a server must know the leader itself
		}
		if why := a.serverNotReady(cl); why != "" {
			return why
		}
	}
	if m.role == roleServer {
		return ""
	}

	// Client (or dev): ask the process itself for its node ID, then the
	// server for the node's state.
	self, err := m.api.Agent().Self()
	if err != nil {
		return "client HTTP API not answering: " + err.Error()
	}
	nodeID := self.Stats["client"]["node_id"]
	if nodeID == "" {
		return "client has no node ID yet"
	}
	m.mu.Lock()
	prev := m.nodeID
	if prev == "" || m.role == roleDev {
		m.nodeID = nodeID
	}
	m.mu.Unlock()
	if prev != "" && prev != nodeID && m.role != roleDev {
		return fmt.Sprintf("node ID changed across restart: was %s, now %s", prev, nodeID)
	}
	node, _, err := a.api.Nodes().Info(nodeID, nil)
	if err != nil {
		return "node " + nodeID + " not registered yet: " + err.Error()
	}
	if node.ModifyIndex <= prevNodeIndex {
		return fmt.Sprintf("node %s has not re-registered since the restart (index %d)", nodeID, node.ModifyIndex)
	}
	if node.Status != api.NodeStatusReady {
		return fmt.Sprintf("node %s status %q", nodeID, node.Status)
	}
	var missing []string
	for _, name := range a.opts.RequireDrivers {
		d := node.Drivers[name]
		switch {
		case d == nil:
			missing = append(missing, name+": not fingerprinted yet")
		case !d.Detected || !d.Healthy:
			missing = append(missing, fmt.Sprintf("%s: detected=%t healthy=%t (%s)", name, d.Detected, d.Healthy, d.HealthDescription))
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return "drivers not ready: " + strings.Join(missing, "; ")
	}
	if node.Drivers["exec"] == nil && time.Since(began) < execFingerprintGrace {
		return "exec driver has not fingerprinted yet"
	}
	return ""
}

// serverNotReady checks leader, ACL bootstrap and keyring once, through cl.
func (a *Agent) serverNotReady(cl *api.Client) string {
	leader, err := cl.Status().Leader()
	if err != nil {
		return "server HTTP API not answering: " + err.Error()
	}
	if leader == "" {
		return "no raft leader yet"
	}
	if a.opts.ACLs && a.Token() == "" {
		tok, _, err := cl.ACLTokens().Bootstrap(nil)
		if err != nil {
			return "ACL bootstrap: " + err.Error()
		}
		a.setToken(tok.SecretID)
	}
	// Clients cannot register until the leader has an active root key to
	// sign node identities with.
	keys, _, err := cl.Keyring().List(nil)
	if err != nil {
		return "keyring: " + err.Error()
	}
	for _, k := range keys {
		if k.State == api.RootKeyStateActive {
			return ""
		}
	}
	return "keyring has no active key yet"
}

// Partition cuts the client off from the server (and from the test, which
// reaches it over the same link): every packet is dropped both ways until
// Heal. Needs AgentOptions.Netns. The process, its plugins and tasks keep
// running; unix sockets (the Task API) still answer, but nothing the client
// asks of the server gets through. Cleanup heals.
func (m *Member) Partition() error {
	if m.link == nil {
		return fmt.Errorf("%s: partition needs AgentOptions.Netns", m.name)
	}
	return m.a.net.setCut(m.link, true)
}

// Heal restores the link cut by Partition.
func (m *Member) Heal() error {
	if m.link == nil {
		return fmt.Errorf("%s: heal needs AgentOptions.Netns", m.name)
	}
	return m.a.net.setCut(m.link, false)
}

// Netns is the name (under /run/netns) of the client's network namespace
// with AgentOptions.Netns, or "".
func (m *Member) Netns() string {
	if m.link == nil {
		return ""
	}
	return m.link.netns
}

// Partitioned reports whether the client is cut off by Partition.
func (m *Member) Partitioned() bool { return m.link != nil && m.a.net.isCut(m.link) }
