package shim

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/lbhook"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

const lbUsage = `Usage:
  lock lb add    [flags] <lock path>   wait until this allocation holds the lock, then ADD it
  lock lb remove [flags] <lock path>   REMOVE what "lock lb add" registered in this allocation
  lock lb state  [flags]               print the service's upstreams

For Nomad lifecycle tasks next to a task that holds the lock itself (e.g. a
docker task with lock as its entrypoint): "lock lb add" as a poststart task,
"lock lb remove" as a poststop task. Flags: -config FILE (its load_balancer and
health_check blocks) and the -lb-* / -health-* flags of "lock"; -wait DURATION
bounds "add". The ADD removes the previous holder's upstream, recorded in the
lock by the holder: give the lock holder (e.g. the entrypoint) -upstream-port
with the same port label, so that a holder that dies without its poststop
REMOVE is swapped out by the next one. Exit codes: 0 done, 64 config, 69 LB or Nomad unreachable, 74 the LB
refused the request, 75 -wait passed.
`

// lbStateFile, in the shared alloc dir, carries the fence and upstream
// from "lock lb add" to "lock lb remove" in the same allocation.
const lbStateFile = ".singleton-lb.json"

type lbCmdState struct {
	Fence    uint64
	Upstream string
}

// runLB is `lock lb add|remove|state`.
func runLB(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "add" && args[0] != "remove" && args[0] != "state") {
		fmt.Fprint(stderr, lbUsage)
		return ExitConfig
	}
	verb := args[0]
	fs := flag.NewFlagSet("lock lb "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, lbUsage) }
	var (
		spec            LBSpec
		health          HealthSpec
		configFile      string
		wait            time.Duration
		namespace, addr string
		verbose         bool
	)
	lbFlags(fs, &spec, &health)
	fs.StringVar(&configFile, "config", "", "")
	fs.DurationVar(&wait, "wait", 0, "")
	fs.StringVar(&namespace, "namespace", "", "")
	fs.StringVar(&addr, "address", "", "")
	fs.BoolVar(&verbose, "verbose", false, "")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return ExitConfig
	}
	log := newLogger(stderr, verbose).Named("lb")
	if configFile != "" {
		c := DefaultConfig()
		if err := loadFile(&c, configFile); err != nil {
			fmt.Fprintf(stderr, "lock lb: %v\n", err)
			return ExitConfig
		}
		spec, health = mergeLB(c.fileLB, spec), mergeHealth(c.fileHealth, health)
	}
	lb, err := buildLBForCommand(spec, health, verb)
	if err != nil {
		fmt.Fprintf(stderr, "lock lb %s: %v\n", verb, err)
		return ExitConfig
	}
	client, err := lbhook.NewClient(lb.Config, lbhook.ClientOptions{Logger: log})
	if err != nil {
		fmt.Fprintf(stderr, "lock lb %s: %v\n", verb, err)
		return ExitConfig
	}
	defer client.Close()
	ctx := context.Background()

	if verb == "state" {
		st, err := client.ServiceState(ctx)
		if err != nil && !errors.Is(err, lbhook.ErrNotFound) {
			fmt.Fprintf(stderr, "lock lb state: %v\n", err)
			return ExitInfra
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st.Upstreams)
		return 0
	}

	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "lock lb %s: give the lock path, e.g. lock lb %s -config lb.hcl nomad/jobs/web/lock\n", verb, verb)
		return ExitConfig
	}
	allocID := os.Getenv("NOMAD_ALLOC_ID")
	allocDir := os.Getenv("NOMAD_ALLOC_DIR")
	if allocID == "" || allocDir == "" {
		fmt.Fprintf(stderr, "lock lb %s: NOMAD_ALLOC_ID and NOMAD_ALLOC_DIR are unset: run it as a task of the allocation that holds the lock\n", verb)
		return ExitConfig
	}
	statePath := filepath.Join(allocDir, lbStateFile)
	self := client.Self(lb.Upstream)

	if verb == "remove" {
		var st lbCmdState
		if err := readLBState(statePath, &st); err != nil {
			log.Info("nothing to remove: lock lb add registered nothing in this allocation", "reason", err)
			return 0
		}
		hook, err := client.ForAlloc(allocID, st.Fence)
		if err != nil {
			fmt.Fprintf(stderr, "lock lb remove: %v\n", err)
			return ExitConfig
		}
		if _, err := hook.Remove(ctx, client.Self(st.Upstream)); err != nil {
			fmt.Fprintf(stderr, "lock lb remove: %s\n", lbhook.Diagnose(err, client.Config()))
			return lbErrorCode(err)
		}
		_ = os.Remove(statePath)
		log.Info("removed from the load balancer", "upstream", st.Upstream)
		return 0
	}

	cfg := DefaultConfig()
	cfg.Path, cfg.Namespace, cfg.Address, cfg.Command = fs.Arg(0), namespace, addr, []string{"lb"}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "lock lb add: %v\n", err)
		return ExitConfig
	}
	locker, err := NewLocker(cfg, log, lockclient.Holder{})
	if err != nil {
		fmt.Fprintf(stderr, "lock lb add: %v\n", err)
		return ExitConfig
	}
	wctx := ctx
	if wait > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	log.Info("waiting until this allocation holds the lock", "path", cfg.Path, "alloc_id", allocID)
	held, err := locker.WaitHeldBy(wctx, allocID)
	if err != nil {
		fmt.Fprintf(stderr, "lock lb add: %v\n", err)
		if wctx.Err() != nil {
			return ExitWaitTimeout
		}
		return ExitInfra
	}
	if lb.Health != nil {
		if err := waitHealthy(wctx, lb.Health); err != nil {
			fmt.Fprintf(stderr, "lock lb add: health check: %v\n", err)
			return ExitWaitTimeout
		}
	}
	hook, err := client.ForAlloc(allocID, held.Fence)
	if err != nil {
		fmt.Fprintf(stderr, "lock lb add: %v\n", err)
		return ExitConfig
	}
	if err := writeLBState(statePath, lbCmdState{Fence: held.Fence, Upstream: self.Upstream}); err != nil {
		fmt.Fprintf(stderr, "lock lb add: record the registration for lock lb remove: %v\n", err)
		return ExitInfra
	}
	// The holder record is what the next holder's ADD swaps out: it must
	// name our upstream, or a holder that dies without its poststop REMOVE
	// (docker kill, OOM, node loss) stays in the LB. Only the process that
	// holds the lock can write it (Nomad refuses other writes to a locked
	// variable), so the holder is told its port: lock -upstream-port.
	switch recorded := held.Holder.Upstream; recorded {
	case self.Upstream:
	case "":
		log.Warn("the lock's holder record names no upstream: should this instance die without `lock lb remove`, "+
			"the next holder cannot swap it out of the load balancer; run the lock holder with "+
			"-upstream-port "+lb.PortLabel, "upstream", self.Upstream)
	default:
		log.Warn("the lock's holder record names another upstream than ours: the next holder will swap out that one, "+
			"not ours; give the lock holder the same -upstream-port as load_balancer.port",
			"recorded", recorded, "upstream", self.Upstream, "port", lb.PortLabel)
	}
	var previous []lbhook.UpstreamInfo
	if up := held.Holder.PreviousUpstream; up != "" {
		previous = append(previous, lbhook.UpstreamInfo{Upstream: up, Group: lb.Group})
	}
	if _, err := hook.Add(ctx, self, previous); err != nil {
		fmt.Fprintf(stderr, "lock lb add: %s\n", lbhook.Diagnose(err, client.Config()))
		return lbErrorCode(err)
	}
	log.Info("registered with the load balancer", "upstream", self.Upstream, "fence", held.Fence,
		"removed_previous", held.Holder.PreviousUpstream)
	return 0
}

// buildLBForCommand builds the LB block for a subcommand: "state" needs no
// port, the others need the port label resolved from the task environment.
func buildLBForCommand(spec LBSpec, health HealthSpec, verb string) (*LoadBalancer, error) {
	if verb == "state" {
		cfg := lbhook.Config{URI: spec.URI, ServiceID: spec.ServiceID, BasePath: "-", Groups: []string{"-"}, PortLabel: "-",
			AuthKeyFile: spec.AuthKeyFile, CAFile: spec.CAFile}
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
		return &LoadBalancer{Config: cfg}, nil
	}
	lb, err := BuildLoadBalancer(spec, health, os.Getenv, "")
	if err == nil && lb == nil {
		err = errors.New("no load balancer configured: give -config with a load_balancer block, or -lb-uri and friends")
	}
	return lb, err
}

func lbErrorCode(err error) int {
	var oe *lbhook.OutcomeError
	if errors.As(err, &oe) {
		return ExitLBFailed
	}
	return ExitInfra
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
