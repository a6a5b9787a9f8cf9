package harness

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/api"
)

// Defaults for AgentOptions and the Agent's clients.
const (
	DefaultStartTimeout = 60 * time.Second
	DefaultStopTimeout  = 30 * time.Second
	// APITimeout bounds every request made through Agent.API. Blocking
	// queries must therefore use a WaitTime well below it.
	APITimeout = 60 * time.Second
	// CLITimeout bounds every Agent.Nomad call.
	CLITimeout = 60 * time.Second
	// cleanupJobTimeout bounds how long cleanup waits for allocations to stop.
	cleanupJobTimeout = 45 * time.Second
)

// DefaultFingerprintDenylist skips fingerprinters that probe cloud metadata.
// env_aws must be skipped here: AWS_CA_BUNDLE is set in CI and makes it fail,
// which aborts the client start.
const DefaultFingerprintDenylist = "env_aws,env_gce,env_azure,env_digitalocean"

// AgentOptions configures StartAgent. The zero value is a non-dev cluster
// (one server process and one client process) without ACLs.
type AgentOptions struct {
	// Dev runs a single `nomad agent -dev`: in-memory state, ACLs off, and the
	// agent stops its allocations when it stops. Restart is not supported.
	Dev bool
	// ACLs enables the ACL system (non-dev only). StartAgent bootstraps it and
	// Agent.Token, API and Env carry the management token.
	ACLs bool
	// PluginDir is passed to the client as -plugin-dir (made absolute).
	// Remember that Nomad 1.11 loads a plugin only if Config has
	// `plugin "<file name>" {}`.
	PluginDir string
	// Config holds extra HCL snippets appended to the client's configuration
	// (the only process in dev mode), e.g. `plugin "singleton" { ... }`.
	Config []string
	// ServerConfig holds extra HCL snippets for the server (non-dev only).
	ServerConfig []string
	// HostVolumes maps client host_volume names to host paths. Missing
	// directories are created. Volumes are writable.
	HostVolumes map[string]string
	// ChrootEnv, if set, replaces the client's chroot_env (source → path in
	// the chroot) for the exec driver. The default copies /bin, /lib, /usr,
	// ... into every task dir, which takes seconds; the static testworkload
	// needs none of it.
	ChrootEnv map[string]string
	// ClientOptions are merged over the harness's client.options (which
	// deny-list the cloud fingerprinters, see DefaultFingerprintDenylist).
	ClientOptions map[string]string
	// RequireDrivers must be detected and healthy on the node before the
	// client counts as ready. Default: raw_exec. The exec driver is always
	// waited for until it has fingerprinted, healthy or not; ask
	// DriverHealthy("exec") whether it can be used.
	RequireDrivers []string
	// Env adds KEY=VALUE entries to the agents' environment. NOMAD_* variables
	// of the test process are never passed on.
	Env []string
	// LogLevel of the agents (default DEBUG).
	LogLevel string
	// StartTimeout bounds each start until ready (default 60s).
	StartTimeout time.Duration
	// StopTimeout bounds the graceful part of each stop, after which the
	// process is killed (default 30s).
	StopTimeout time.Duration
	// Clients is the number of client processes (non-dev only; default 1).
	// Each is its own node with its own data dir; Client() is the first.
	Clients int
	// Netns runs every client in its own network namespace, joined to the
	// server through a bridge of its own (see netLab), so that a test can
	// cut a client off from the server with Member.Partition and heal it.
	// Needs root, ip and nsenter; non-dev only.
	Netns bool
	// Docker, from StartDocker, adds the docker plugin's config block
	// pointing at that engine (Docker.PluginConfig) and waits until the
	// docker driver is healthy, besides RequireDrivers.
	Docker *Docker
	// HeartbeatTTL sets the server's min_heartbeat_ttl and heartbeat_grace
	// (non-dev only): a client that stops heartbeating is marked down 2 to 3
	// times this after its last heartbeat. 0 keeps Nomad's 10s each.
	HeartbeatTTL time.Duration
	// Servers is the number of server processes (non-dev only; default 1).
	// With more than one they form one Raft cluster (bootstrap_expect =
	// Servers), every client knows them all, and Server() is the first.
	// Kill a server (Member.Kill) and Start it again, with its data dir, to
	// force a leader election; Agent.Leader names the leader. Not with Netns.
	Servers int
	// TLS, from NewTLS, serves the HTTP API over HTTPS with mutual TLS;
	// Addr is then https, and API, Env and Nomad present its client
	// certificate.
	TLS *TLS
}

// Agent is a Nomad cluster of one node, owned by one test.
//
// In dev mode it is a single `nomad agent -dev` process. Otherwise it is two
// processes, a server and a client, each with its own data dir. Two processes
// because (1) a combined agent races its own keyring at every start: the
// client's first Node.Register fails ("keyring has not been initialized yet",
// or "Permission denied" after a restart) and is retried only 15-30s later;
// and (2) fault tests need the client (which serves the Task API and runs
// the tasks) to stop or freeze while the server, and its lock TTL timers,
// keep going, as in production.
//
// Start, Stop, Restart, Pause and Resume act on the client; Server() and
// Client() give access to each process. API and Env talk to the server, so
// they keep working while the client is down.
//
// Create it with StartAgent; t.Cleanup stops its jobs and processes and
// removes its files.
type Agent struct {
	t    testing.TB
	opts AgentOptions
	log  hclog.Logger
	bin  string
	dir  string // private short dir holding all data dirs
	api  *api.Client

	server  *Member   // == servers[0]
	servers []*Member // every server process (non-dev), in start order
	client  *Member   // == server in dev mode; == clients[0] otherwise
	clients []*Member // every client process, in start order
	net     *netLab   // with AgentOptions.Netns

	mu    sync.Mutex
	token string

	releases []func() // of reservations held for the agent's life
}

// StartAgent starts a Nomad cluster configured by opts and waits until it is
// ready: a leader is elected, the keyring is initialized, the client node is
// registered and ready, and the required drivers are healthy. The test fails
// if that does not happen within opts.StartTimeout per process.
func StartAgent(t testing.TB, opts AgentOptions) *Agent {
	t.Helper()
	SkipOutsideSmoke(t)
	if opts.Dev && (opts.ACLs || len(opts.ServerConfig) > 0 || opts.Clients > 1 || opts.Netns || opts.HeartbeatTTL > 0 || opts.Servers > 1) {
		t.Fatalf("harness: ACLs, ServerConfig, Clients, Servers, Netns and HeartbeatTTL need a non-dev agent (AgentOptions.Dev=false)")
	}
	if opts.Servers > 1 && opts.Netns {
		t.Fatalf("harness: AgentOptions.Servers > 1 does not combine with Netns")
	}
	if opts.Clients < 1 {
		opts.Clients = 1
	}
	if opts.Servers < 1 {
		opts.Servers = 1
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = DefaultStopTimeout
	}
	if opts.LogLevel == "" {
		opts.LogLevel = "DEBUG"
	}
	if len(opts.RequireDrivers) == 0 {
		opts.RequireDrivers = []string{"raw_exec"}
	}
	endpoint := ""
	if opts.Docker != nil {
		endpoint = opts.Docker.Endpoint
	}
	opts.Config = slices.Clone(opts.Config)
	for i, c := range opts.Config {
		opts.Config[i] = strings.ReplaceAll(c, DockerEndpointPlaceholder, endpoint)
	}
	if opts.Docker != nil {
		opts.Config = append(opts.Config, opts.Docker.PluginConfig())
		if !slices.Contains(opts.RequireDrivers, "docker") {
			opts.RequireDrivers = append(slices.Clone(opts.RequireDrivers), "docker")
		}
	}
	if opts.PluginDir != "" {
		abs, err := filepath.Abs(opts.PluginDir)
		if err != nil {
			t.Fatalf("harness: plugin dir: %v", err)
		}
		opts.PluginDir = abs
	}
	for name, path := range opts.HostVolumes {
		if err := os.MkdirAll(path, 0o755); err != nil {
			t.Fatalf("harness: host volume %q: %v", name, err)
		}
	}

	a := &Agent{t: t, opts: opts, log: NewLogger(t, "harness.agent"), bin: NomadBin(t)}

	// Config files and logs live in t.TempDir(), created before registering
	// cleanup so that it is removed only after cleanup has printed the logs.
	meta := t.TempDir()
	logDir := meta
	if keep := os.Getenv(EnvLogDir); keep != "" {
		logDir = filepath.Join(keep, fmt.Sprintf("%s-%d", strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()), time.Now().UnixNano()))
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			t.Fatalf("harness: %s: %v", EnvLogDir, err)
		}
	}
	// Unix socket paths are limited to 108 bytes, and the Task API socket is
	// <alloc_dir>/<alloc id>/<task>/secrets/api.sock. t.TempDir() paths are
	// far too long, so data dirs live in a short private directory
	// (/tmp/nmdNNNN/d/alloc/...: task names up to ~25 bytes fit) that cleanup
	// unmounts and removes.
	base := os.TempDir()
	if len(base) > 24 {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "nmd")
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	// Searchable (not readable) by others, as a client's data_dir must be
	// for tasks that run as an unprivileged user.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatalf("harness: %v", err)
	}
	a.dir = dir
	t.Cleanup(a.cleanup)

	if opts.Netns {
		if a.net, err = newNetLab(opts.Clients); err != nil {
			t.Fatalf("harness: %v", err)
		}
	}
	// name tells clients apart: "client", "client2", ...
	newMember := func(role, name string, index int) *Member {
		ports, err := freePorts(3)
		if err != nil {
			t.Fatalf("harness: %v", err)
		}
		short := map[string]string{roleServer: "s", roleClient: "d", roleDev: "d"}[role]
		if role == roleServer && name != roleServer {
			short = "s" + strings.TrimPrefix(name, roleServer)
		}
		if index > 1 {
			short += strconv.Itoa(index)
		}
		m := &Member{
			a: a, role: role, name: name, ip: "127.0.0.1", iface: "lo",
			dataDir:  filepath.Join(dir, short),
			cfgPath:  filepath.Join(meta, name+".hcl"),
			logPath:  filepath.Join(logDir, name+".log"),
			httpPort: ports[0], rpcPort: ports[1], serfPort: ports[2],
		}
		switch {
		case a.net != nil && role == roleServer:
			m.ip = a.net.hostIP
		case a.net != nil:
			m.link = a.net.links[index-1]
			m.ip, m.iface = m.link.ip, m.link.nsVeth
		case role != roleServer:
			// On the loopback address every client hands out task ports:
			// one block of the range each (a client in a network
			// namespace has an address of its own).
			if low, high, release, ok := dynamicBlock(); ok {
				m.dynamicPorts = [2]int{low, high}
				a.releases = append(a.releases, release)
			} else {
				a.log.Warn("every block of the dynamic port range is held: this client shares the whole range", "low", dynamicPortsLow, "high", dynamicPortsHigh)
			}
		}
		return m
	}
	if opts.Dev {
		a.server = newMember(roleDev, roleDev, 0)
		a.client = a.server
		a.clients = []*Member{a.server}
	} else {
		for i := 1; i <= opts.Servers; i++ {
			name := roleServer
			if i > 1 {
				name += strconv.Itoa(i)
			}
			a.servers = append(a.servers, newMember(roleServer, name, 0))
		}
		a.server = a.servers[0]
		for i := 1; i <= opts.Clients; i++ {
			name := roleClient
			if i > 1 {
				name += strconv.Itoa(i)
			}
			a.clients = append(a.clients, newMember(roleClient, name, i))
		}
		a.client = a.clients[0]
	}
	for _, m := range a.members() {
		if err := os.Mkdir(m.dataDir, 0o711); err != nil {
			t.Fatalf("harness: data dir: %v", err)
		}
		if err := os.WriteFile(m.cfgPath, []byte(m.renderConfig()), 0o644); err != nil {
			t.Fatalf("harness: write agent config: %v", err)
		}
	}

	if a.api, err = a.newAPIClient(a.server.Addr(), APITimeout); err != nil {
		t.Fatalf("harness: %v", err)
	}
	for _, m := range a.members() {
		if m.api, err = a.newAPIClient(m.Addr(), APITimeout); err != nil {
			t.Fatalf("harness: %v", err)
		}
	}

	began := time.Now()
	if len(a.servers) > 1 {
		// No server is ready before a quorum has elected a leader.
		errs := make([]error, len(a.servers))
		var wg sync.WaitGroup
		for i, m := range a.servers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = m.Start()
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("harness: start servers: %v", err)
		}
	}
	for _, m := range a.members() {
		if m.Running() {
			continue
		}
		if err := m.Start(); err != nil {
			t.Fatalf("harness: start %s agent: %v", m.name, err)
		}
	}
	a.log.Info("agent ready", "addr", a.Addr(), "dev", opts.Dev, "acls", opts.ACLs,
		"node_id", a.NodeID(), "took", time.Since(began).Round(time.Millisecond),
		"exec_healthy", a.DriverHealthy("exec"), "logs", logDir)
	return a
}

// newAPIClient is an API client of addr whose requests time out after
// timeout, with the cluster's client certificate under TLS.
func (a *Agent) newAPIClient(addr string, timeout time.Duration) (*api.Client, error) {
	hc := &http.Client{Timeout: timeout, Transport: http.DefaultTransport.(*http.Transport).Clone()}
	if a.opts.TLS != nil {
		if err := api.ConfigureTLS(hc, a.opts.TLS.apiTLS()); err != nil {
			return nil, fmt.Errorf("api client for %s: %w", addr, err)
		}
	}
	cl, err := api.NewClient(&api.Config{Address: addr, SecretID: a.Token(), HttpClient: hc})
	if err != nil {
		return nil, fmt.Errorf("api client for %s: %w", addr, err)
	}
	return cl, nil
}

// setToken records the management token and hands it to every api client.
func (a *Agent) setToken(token string) {
	a.mu.Lock()
	a.token = token
	a.mu.Unlock()
	a.api.SetSecretID(token)
	for _, m := range a.members() {
		m.api.SetSecretID(token)
	}
}

// members returns the distinct processes, servers first.
func (a *Agent) members() []*Member {
	switch {
	case a.server == nil || a.client == nil:
		return nil // StartAgent failed before creating them
	case a.client == a.server:
		return []*Member{a.server}
	}
	return append(slices.Clone(a.servers), a.clients...)
}

// Servers are all server processes (AgentOptions.Servers), first to last;
// in dev mode the one agent.
func (a *Agent) Servers() []*Member {
	if a.opts.Dev {
		return []*Member{a.server}
	}
	return slices.Clone(a.servers)
}

// Leader is the server that a running server names as the Raft leader, or
// nil if none of them knows one (during an election).
func (a *Agent) Leader() *Member {
	for _, m := range a.Servers() {
		if !m.Running() || m.isPaused() {
			continue
		}
		addr, err := m.api.Status().Leader()
		if err != nil || addr == "" {
			continue
		}
		for _, s := range a.Servers() {
			if s.RPCAddr() == addr {
				return s
			}
		}
	}
	return nil
}

// Server is the server process (in dev mode, the only process).
func (a *Agent) Server() *Member { return a.server }

// Client is the (first) client process (in dev mode, the only process). It
// serves the Task API sockets and supervises the tasks.
func (a *Agent) Client() *Member { return a.client }

// Clients are all client processes (AgentOptions.Clients), first to last.
func (a *Agent) Clients() []*Member { return slices.Clone(a.clients) }

// ClientOf returns the client process whose node is nodeID, or nil.
func (a *Agent) ClientOf(nodeID string) *Member {
	for _, m := range a.clients {
		if m.NodeID() == nodeID {
			return m
		}
	}
	return nil
}

// Addr is the server's HTTP address, e.g. http://127.0.0.1:41234.
func (a *Agent) Addr() string { return a.server.Addr() }

// API returns an api client for the server, carrying the management token
// when ACLs are on. Each request is bounded by APITimeout.
func (a *Agent) API() *api.Client { return a.api }

// Token is the management token ("" without ACLs).
func (a *Agent) Token() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.token
}

// NodeID is the ID of the (first) client's node. It survives Restart.
func (a *Agent) NodeID() string { return a.client.NodeID() }

// AllocDir is the (first) client's alloc dir; <AllocDir>/<alloc id>/<task>
// is a task dir.
func (a *Agent) AllocDir() string { return a.client.AllocDir() }

// Env returns NOMAD_ADDR (and NOMAD_TOKEN with ACLs, the TLS variables with
// TLS) as KEY=VALUE entries for
// running the nomad CLI or other tools against this cluster.
func (a *Agent) Env() []string {
	env := []string{"NOMAD_ADDR=" + a.Addr()}
	if a.opts.TLS != nil {
		env = append(env, a.opts.TLS.env()...)
	}
	if tok := a.Token(); tok != "" {
		env = append(env, "NOMAD_TOKEN="+tok)
	}
	return env
}

// Start starts the client again after Stop, and waits until it is ready.
func (a *Agent) Start() error { return a.client.Start() }

// Stop stops the client (see Member.Stop). Its tasks keep running, unless
// this is a dev agent.
func (a *Agent) Stop() error { return a.client.Stop() }

// Restart restarts the client with the same data dir, ports and node ID, and
// waits until it has re-registered and is ready. Not supported in dev mode.
func (a *Agent) Restart() error { return a.client.Restart() }

// Pause freezes the client with SIGSTOP: the Task API stops answering and
// the node stops heartbeating, while tasks and the server keep running.
func (a *Agent) Pause() error { return a.client.Pause() }

// Resume continues a paused client with SIGCONT.
func (a *Agent) Resume() error { return a.client.Resume() }

// Nomad runs the nomad CLI against this cluster (NOMAD_ADDR and NOMAD_TOKEN
// set), bounded by CLITimeout, and returns its combined output. A non-zero
// exit fails the test; use TryNomad when failure is expected.
func (a *Agent) Nomad(t testing.TB, args ...string) string {
	t.Helper()
	out, err := a.TryNomad(t, args...)
	if err != nil {
		t.Fatalf("harness: nomad %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// TryNomad is Nomad without failing the test: it returns the combined output
// and the error (an *exec.ExitError for a non-zero exit).
func (a *Agent) TryNomad(t testing.TB, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), CLITimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, a.bin, args...)
	cmd.Env = append(filterEnv(os.Environ(), "NOMAD_"), a.Env()...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %s: %w", CLITimeout, err)
	}
	return string(out), err
}

// DriverHealthy reports whether the node has fingerprinted the driver as
// detected and healthy (e.g. to skip exec-driver tests where it cannot run).
func (a *Agent) DriverHealthy(name string) bool {
	node, _, err := a.api.Nodes().Info(a.NodeID(), nil)
	if err != nil || node == nil {
		return false
	}
	d := node.Drivers[name]
	return d != nil && d.Detected && d.Healthy
}

func filterEnv(env []string, prefix string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, prefix) {
			out = append(out, kv)
		}
	}
	return out
}

// errorf is for failures that must not stop cleanup.
func (a *Agent) errorf(format string, args ...any) {
	a.t.Helper()
	a.t.Errorf("harness: "+format, args...)
}

var errNotRunning = errors.New("agent process is not running")
