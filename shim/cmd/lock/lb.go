package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// lbStateFile, in the shared alloc dir, carries the fence and upstream
// from "lock lb add" to "lock lb remove" in the same allocation.
const lbStateFile = ".singleton-lb.json"

type lbCmdState struct {
	Fence    uint64
	Upstream string
}

// lbCmd is one `lock lb` command, parsed, with its LB client.
type lbCmd struct {
	verb            string
	args            []string // what follows the flags: the lock path
	wait            time.Duration
	namespace, addr string
	lb              *shim.LoadBalancer
	client          *lbhook.Client
	log             hclog.Logger
	stdout, stderr  io.Writer
}

// runLB is `lock lb add|remove|follow|state`.
func runLB(args []string, stdout, stderr io.Writer) int {
	c, code, ok := parseLBArgs(args, stdout, stderr)
	if !ok {
		return code
	}
	defer c.client.Close()
	ctx := context.Background()

	if c.verb == "state" {
		return c.state(ctx)
	}
	verb := c.verb
	if len(c.args) != 1 {
		fmt.Fprintf(stderr, "lock lb %s: give the lock path, e.g. lock lb %s -config lb.hcl nomad/jobs/web/lock\n", verb, verb)
		return shim.ExitConfig
	}
	allocID := os.Getenv("NOMAD_ALLOC_ID")
	if verb == "follow" {
		if allocID == "" {
			fmt.Fprintln(stderr, "lock lb follow: NOMAD_ALLOC_ID is unset: run it as a poststart sidecar task of the allocation whose lock holder it follows")
			return shim.ExitConfig
		}
		return c.follow(ctx, allocID)
	}
	allocDir := os.Getenv("NOMAD_ALLOC_DIR")
	if allocID == "" || allocDir == "" {
		fmt.Fprintf(stderr, "lock lb %s: NOMAD_ALLOC_ID and NOMAD_ALLOC_DIR are unset: run it as a task of the allocation that holds the lock\n", verb)
		return shim.ExitConfig
	}
	statePath := filepath.Join(allocDir, lbStateFile)
	if verb == "remove" {
		return c.remove(ctx, allocID, statePath)
	}
	return c.add(ctx, allocID, statePath)
}

// parseLBArgs parses the verb and flags of `lock lb`, lays them over the
// -config file's blocks, and makes the LB client. ok is false, with the
// exit code, when the command ends here (usage, -h, a config error).
func parseLBArgs(args []string, stdout, stderr io.Writer) (c *lbCmd, code int, ok bool) {
	if len(args) == 0 || !slices.Contains([]string{"add", "remove", "follow", "state"}, args[0]) {
		newLBFlags("lock lb", &lbCmd{}, stderr).fs.Usage()
		return nil, shim.ExitConfig, false
	}
	c = &lbCmd{verb: args[0], stdout: stdout, stderr: stderr}
	verb := c.verb
	f := newLBFlags("lock lb "+verb, c, stderr)
	if err := f.fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0, false
		}
		return nil, shim.ExitConfig, false
	}
	c.args = f.fs.Args()
	c.log = newLogger(stderr, f.verbose).Named("lb")
	spec, health := f.spec, f.health
	if f.configFile != "" {
		cfg := shim.DefaultConfig()
		file, err := loadFile(&cfg, f.configFile)
		if err != nil {
			fmt.Fprintf(stderr, "lock lb: %v\n", err)
			return nil, shim.ExitConfig, false
		}
		spec, health = mergeLB(file.lb, spec), mergeHealth(file.health, health)
	}
	var err error
	if c.lb, err = buildLBForCommand(spec, health, verb); err != nil {
		fmt.Fprintf(stderr, "lock lb %s: %v\n", verb, err)
		return nil, shim.ExitConfig, false
	}
	if c.client, err = lbhook.NewClient(c.lb.Config, lbhook.ClientOptions{Logger: c.log}); err != nil {
		fmt.Fprintf(stderr, "lock lb %s: %v\n", verb, err)
		return nil, shim.ExitConfig, false
	}
	return c, 0, true
}

// lbFlagSet is the flags of `lock lb <verb>`: -wait, -namespace and -address
// go to the command, the LB blocks and -config are laid over each other.
type lbFlagSet struct {
	fs         *flag.FlagSet
	spec       shim.LBSpec
	health     shim.HealthSpec
	configFile string
	verbose    bool
}

func newLBFlags(name string, c *lbCmd, stderr io.Writer) *lbFlagSet {
	f := &lbFlagSet{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	fs := f.fs
	fs.SetOutput(stderr)
	fs.Usage = helpFor(fs, stderr, lbHelpHead, lbHelpTail)
	lbFlags(fs, &f.spec, &f.health)
	fs.StringVar(&f.configFile, "config", "", "HCL `file` whose load_balancer and health_check blocks to use; flags override them")
	fs.DurationVar(&c.wait, "wait", 0, "add: give up (exit 75) unless this allocation holds the lock, "+
		"and the health check passes, within this `duration`; 0 waits forever")
	fs.StringVar(&c.namespace, "namespace", "", settingUsage("namespace"))
	fs.StringVar(&c.addr, "address", "", addressUsage)
	fs.BoolVar(&f.verbose, "verbose", false, verboseUsage)
	return f
}

// state is `lock lb state`: the service's upstreams, as JSON.
func (c *lbCmd) state(ctx context.Context) int {
	st, err := c.client.ServiceState(ctx)
	if err != nil && !errors.Is(err, lbhook.ErrNotFound) {
		fmt.Fprintf(c.stderr, "lock lb state: %v\n", err)
		return shim.ExitInfra
	}
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(st.Upstreams)
	return 0
}

// remove is `lock lb remove`: REMOVE what `lock lb add` registered in this
// allocation, as it recorded it in statePath.
func (c *lbCmd) remove(ctx context.Context, allocID, statePath string) int {
	var st lbCmdState
	if err := readLBState(statePath, &st); err != nil {
		c.log.Info("nothing to remove: lock lb add registered nothing in this allocation", "reason", err)
		return 0
	}
	hook, err := c.client.ForAlloc(allocID, st.Fence)
	if err != nil {
		fmt.Fprintf(c.stderr, "lock lb remove: %v\n", err)
		return shim.ExitConfig
	}
	if _, err := hook.Remove(ctx, c.client.Self(st.Upstream)); err != nil {
		fmt.Fprintf(c.stderr, "lock lb remove: %s\n", lbhook.Diagnose(err, c.client.Config()))
		return lbErrorCode(err)
	}
	_ = os.Remove(statePath)
	c.log.Info("removed from the load balancer", "upstream", st.Upstream)
	return 0
}

// add is `lock lb add`: once this allocation holds the lock (and the health
// check passes), record the registration for `lock lb remove` in statePath
// and ADD our upstream, swapping out the previous holder's.
func (c *lbCmd) add(ctx context.Context, allocID, statePath string) int {
	held, code, ok := c.waitHeld(ctx, allocID)
	if !ok {
		return code
	}
	self := c.client.Self(c.lb.Upstream)
	hook, err := c.client.ForAlloc(allocID, held.Fence)
	if err != nil {
		fmt.Fprintf(c.stderr, "lock lb add: %v\n", err)
		return shim.ExitConfig
	}
	if err := writeLBState(statePath, lbCmdState{Fence: held.Fence, Upstream: self.Upstream}); err != nil {
		fmt.Fprintf(c.stderr, "lock lb add: record the registration for lock lb remove: %v\n", err)
		return shim.ExitInfra
	}
	c.checkHolderRecord(held.Holder.Upstream, self.Upstream)
	var previous []lbhook.UpstreamInfo
	if up := held.Holder.PreviousUpstream; up != "" {
		previous = append(previous, lbhook.UpstreamInfo{Upstream: up, Group: c.lb.Group})
	}
	if _, err := hook.Add(ctx, self, previous); err != nil {
		fmt.Fprintf(c.stderr, "lock lb add: %s\n", lbhook.Diagnose(err, c.client.Config()))
		return lbErrorCode(err)
	}
	c.log.Info("registered with the load balancer", "upstream", self.Upstream, "fence", held.Fence,
		"removed_previous", held.Holder.PreviousUpstream)
	return 0
}

// follow is `lock lb follow`: keep this allocation's upstream in the LB
// for each of its tenures of the lock, until SIGTERM or SIGINT (the
// sidecar's kill), then remove it.
func (c *lbCmd) follow(ctx context.Context, allocID string) int {
	locker, code, ok := c.locker("follow")
	if !ok {
		return code
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	c.log.Info("following the lock's holder record", "path", c.args[0], "alloc_id", allocID, "upstream", c.lb.Upstream)
	f := &shim.LBFollower{LB: c.lb, Client: c.client, Locker: locker, AllocID: allocID, Logger: c.log}
	if err := f.Run(ctx); err != nil {
		return c.followFailed(err)
	}
	return 0
}

// followFailed reports why `lock lb follow` ended, and returns its exit code.
func (c *lbCmd) followFailed(err error) int {
	if errors.Is(err, shim.ErrLBFollowADD) {
		fmt.Fprintf(c.stderr, "lock lb follow: %v\n", err)
		return shim.ExitLBFailed
	}
	var pe *lockclient.PermissionError
	var ce *lockclient.ConfigError
	job := cmp.Or(os.Getenv("NOMAD_JOB_ID"), "<job>")
	switch {
	case errors.As(err, &pe):
		// Not pe's own text: it names the write policy of a lock holder.
		fmt.Fprintf(c.stderr, "lock lb follow: read %s: permission denied (HTTP 403).\n", c.args[0])
		fmt.Fprintf(c.stderr, "lock lb follow only reads the lock, but its token needs \"read\" on %s, which the implicit "+
			"workload-identity policy does not grant: apply examples/acl/singleton-lock.policy.hcl to the job (-job %s), "+
			"or examples/acl/singleton-lock-read.policy.hcl to this task alone (-job %s -group %s -task %s)\n",
			c.args[0], job, job, cmp.Or(os.Getenv("NOMAD_GROUP_NAME"), "<group>"), cmp.Or(os.Getenv("NOMAD_TASK_NAME"), "<task>"))
		return shim.ExitPermission
	}
	fmt.Fprintf(c.stderr, "lock lb follow: %v\n", err)
	if errors.As(err, &ce) {
		return shim.ExitConfig
	}
	return shim.ExitInfra
}

// locker is the Locker of the lock path, for reads only.
func (c *lbCmd) locker(verb string) (*lockclient.Locker, int, bool) {
	cfg := shim.DefaultConfig()
	cfg.Path, cfg.Namespace, cfg.Address = c.args[0], c.namespace, c.addr
	if err := cfg.ValidateLock(); err != nil {
		fmt.Fprintf(c.stderr, "lock lb %s: %v\n", verb, err)
		return nil, shim.ExitConfig, false
	}
	locker, err := shim.NewLocker(cfg, c.log, lockclient.Holder{})
	if err != nil {
		fmt.Fprintf(c.stderr, "lock lb %s: %v\n", verb, err)
		return nil, shim.ExitConfig, false
	}
	return locker, 0, true
}

// waitHeld waits, within -wait, until allocID holds the lock and the health
// check (if any) passes, and returns the lock's status. ok is false, with
// the exit code, when it does not.
func (c *lbCmd) waitHeld(ctx context.Context, allocID string) (held lockclient.Status, code int, ok bool) {
	locker, code, ok := c.locker("add")
	if !ok {
		return held, code, false
	}
	wctx := ctx
	if c.wait > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, c.wait)
		defer cancel()
	}
	c.log.Info("waiting until this allocation holds the lock", "path", c.args[0], "alloc_id", allocID)
	held, err := locker.WaitHeldBy(wctx, allocID)
	if err != nil {
		fmt.Fprintf(c.stderr, "lock lb add: %v\n", err)
		if wctx.Err() != nil {
			return held, shim.ExitWaitTimeout, false
		}
		return held, shim.ExitInfra, false
	}
	if c.lb.Health != nil {
		if err := c.lb.Health.Wait(wctx); err != nil {
			fmt.Fprintf(c.stderr, "lock lb add: health check: %v\n", err)
			return held, shim.ExitWaitTimeout, false
		}
	}
	return held, 0, true
}

// checkHolderRecord warns when the lock's holder record does not name our
// upstream. The holder record is what the next holder's ADD swaps out: it
// must name our upstream, or a holder that dies without its poststop REMOVE
// (docker kill, OOM, node loss) stays in the LB. Only the process that
// holds the lock can write it (Nomad refuses other writes to a locked
// variable), so the holder is told its port: lock -upstream-port.
func (c *lbCmd) checkHolderRecord(recorded, upstream string) {
	switch recorded {
	case upstream:
	case "":
		c.log.Warn("the lock's holder record names no upstream: should this instance die without `lock lb remove`, "+
			"the next holder cannot swap it out of the load balancer; run the lock holder with "+
			"-upstream-port "+c.lb.PortLabel, "upstream", upstream)
	default:
		c.log.Warn("the lock's holder record names another upstream than ours: the next holder will swap out that one, "+
			"not ours; give the lock holder the same -upstream-port as load_balancer.port",
			"recorded", recorded, "upstream", upstream, "port", c.lb.PortLabel)
	}
}

// buildLBForCommand builds the LB block for a subcommand: "state" needs no
// port, the others need the port label resolved from the task environment.
func buildLBForCommand(spec shim.LBSpec, health shim.HealthSpec, verb string) (*shim.LoadBalancer, error) {
	if verb == "state" {
		cfg := lbhook.Config{URI: spec.URI, ServiceID: spec.ServiceID, BasePath: "-", Groups: []string{"-"}, PortLabel: "-",
			AuthKeyFile: spec.AuthKeyFile, CAFile: spec.CAFile}
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
		return &shim.LoadBalancer{Config: cfg}, nil
	}
	lb, err := shim.BuildLoadBalancer(spec, health, os.Getenv, "")
	if err == nil && lb == nil {
		err = errors.New("no load balancer configured: give -config with a load_balancer block, or -lb-uri and friends")
	}
	return lb, err
}

func lbErrorCode(err error) int {
	var oe *lbhook.OutcomeError
	if errors.As(err, &oe) {
		return shim.ExitLBFailed
	}
	return shim.ExitInfra
}

func readLBState(path string, st *lbCmdState) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, st)
}

func writeLBState(path string, st lbCmdState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
