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
	"slices"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/shim"
)

// lbCmd is one `lock lb` command, parsed, with its LB client.
type lbCmd struct {
	verb      string
	args      []string // what follows the flags: the lock path
	namespace string
	conn      *connFlags
	// holders, above 0, makes the path a semaphore's prefix: follow
	// every one of its slots (lock -n N).
	holders        int
	lb             *shim.LoadBalancer
	client         *lbhook.Client
	log            hclog.Logger
	stdout, stderr io.Writer
}

// runLB is `lock lb follow|state`; the retired `add` and `remove` only say
// what replaces them.
func runLB(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if msg, ok := retiredLB[args[0]]; ok {
			fmt.Fprintf(stderr, "lock lb %s: %s\n", args[0], msg)
			return shim.ExitConfig
		}
	}
	c, code, ok := parseLBArgs(args, stdout, stderr)
	if !ok {
		return code
	}
	defer c.client.Close()
	ctx := context.Background()

	if c.verb == "state" {
		return c.state(ctx)
	}
	if len(c.args) != 1 {
		fmt.Fprintln(stderr, "lock lb follow: give the lock path, e.g. lock lb follow -config lb.hcl nomad/jobs/web/lock")
		return shim.ExitConfig
	}
	allocID := os.Getenv("NOMAD_ALLOC_ID")
	if allocID == "" {
		fmt.Fprintln(stderr, "lock lb follow: NOMAD_ALLOC_ID is unset: run it as a poststart sidecar task of the allocation whose lock holder it follows")
		return shim.ExitConfig
	}
	return c.follow(ctx, allocID)
}

// retiredLB is what replaces each retired `lock lb` verb. They registered
// once per allocation (a poststart ADD, a poststop REMOVE), so an
// allocation that won the lock back after a task restart was never added
// again, and a killed holder whose allocation survived was never removed.
var retiredLB = map[string]string{
	"add": `retired: it added the allocation once, so an allocation that wins the lock back after a task restart ` +
		`was never added again. Run "lock lb follow" (the same -config or -lb-* flags and lock path) as a poststart sidecar task ` +
		"(" + shim.LBFollowLifecycleHCL + `) instead: it adds the allocation for each of its tenures ` +
		`of the lock, and removes it when a tenure ends, so drop the "lock lb remove" poststop task too. ` +
		`See docs/lock-lb.md and examples/lock-docker-lb-hooks.nomad.hcl`,
	"remove": `retired: it ran only when the allocation stopped, never when a killed holder's task restarted. ` +
		`Drop this poststop task and run "lock lb follow" (the same -config or -lb-* flags and lock path) as a poststart sidecar task ` +
		"(" + shim.LBFollowLifecycleHCL + `) instead of "lock lb add": it removes the allocation ` +
		`when each tenure of the lock ends and when the allocation stops. ` +
		`See docs/lock-lb.md and examples/lock-docker-lb-hooks.nomad.hcl`,
}

// parseLBArgs parses the verb and flags of `lock lb`, lays them over the
// -config file's blocks, and makes the LB client. ok is false, with the
// exit code, when the command ends here (usage, -h, a config error).
func parseLBArgs(args []string, stdout, stderr io.Writer) (c *lbCmd, code int, ok bool) {
	if len(args) == 0 || !slices.Contains([]string{"follow", "state"}, args[0]) {
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
	if err := c.conn.refuseToken(); err != nil {
		fmt.Fprintf(stderr, "lock lb %s: %v\n", verb, err)
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
	fs.StringVar(&c.namespace, "namespace", "", settingUsage("namespace"))
	c.conn = newConnFlags(fs)
	if name == "lock lb follow" || name == "lock lb" {
		fs.IntVar(&c.holders, "n", 0, "follow a semaphore of `N` slots at the path, as the holders' lock -n N: "+
			"this allocation is listed while it holds any slot (docs/semaphore.md)")
	}
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

// follow is `lock lb follow`: keep this allocation's upstream in the LB
// for each of its tenures of the lock, until SIGTERM or SIGINT (the
// sidecar's kill), then remove it.
func (c *lbCmd) follow(ctx context.Context, allocID string) int {
	locker, code, ok := c.locker()
	if !ok {
		return code
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	c.log.Info("following the lock's holder record", "path", c.args[0], "holders", c.holders, "alloc_id", allocID, "upstream", c.lb.Upstream)
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
		path := c.args[0]
		if c.holders > 0 {
			path += "/*" // every slot
		}
		fmt.Fprintf(c.stderr, "lock lb follow: read %s: permission denied (HTTP 403).\n", path)
		fmt.Fprintf(c.stderr, "lock lb follow only reads the lock, but its token needs \"read\" on %s, which the implicit "+
			"workload-identity policy does not grant: apply examples/acl/singleton-lock.policy.hcl to the job (-job %s), "+
			"or examples/acl/singleton-lock-read.policy.hcl to this task alone (-job %s -group %s -task %s)\n",
			path, job, job, cmp.Or(os.Getenv("NOMAD_GROUP_NAME"), "<group>"), cmp.Or(os.Getenv("NOMAD_TASK_NAME"), "<task>"))
		return shim.ExitPermission
	}
	fmt.Fprintf(c.stderr, "lock lb follow: %v\n", err)
	if errors.As(err, &ce) {
		return shim.ExitConfig
	}
	return shim.ExitInfra
}

// locker is the Locker of the lock path, for reads only.
func (c *lbCmd) locker() (*lockclient.Locker, int, bool) {
	cfg := shim.DefaultConfig()
	cfg.Path, cfg.Namespace, cfg.Holders = c.args[0], c.namespace, c.holders
	c.conn.apply(&cfg)
	if err := cfg.ValidateLock(); err != nil {
		fmt.Fprintf(c.stderr, "lock lb follow: %v\n", err)
		return nil, shim.ExitConfig, false
	}
	locker, err := shim.NewLocker(shim.Spec{Config: cfg}, c.log)
	if err != nil {
		fmt.Fprintf(c.stderr, "lock lb follow: %v\n", err)
		return nil, shim.ExitConfig, false
	}
	return locker, 0, true
}

// buildLBForCommand builds the LB block for a subcommand: "state" needs no
// port, "follow" needs the port label resolved from the task environment.
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
