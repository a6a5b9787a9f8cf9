package shim

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/nomad-driver-singleton/nomad-driver-singleton/lockclient"
)

// Version is set at build time with -ldflags "-X .../shim.Version=...".
var Version = "0.1.0-dev"

const usageText = `Usage:
  lock [flags] <path> <command> [args...]   run command while holding the lock at <path>
  lock status [-json] [-namespace NS] <path> show who holds the lock at <path>
  lock lb add|remove|state [flags] [<path>]  LB hooks for lifecycle tasks (lock lb -h)
  lock version

Runs <command> (no shell, arguments exact) only while it holds a TTL lock on the
Nomad Variable <path>, taken through the Task API socket. The command runs in its
own process group and is stopped the moment the lock is lost.

Flags (nomad var lock compatible):
  -ttl DURATION        lock TTL, 10s to 24h (default 15s)
  -delay DURATION      lock delay after an unclean loss, > 0 (default 5s; nomad var lock: 15s)
  -shell               run the command with $SHELL -c (default false; nomad var lock: true)
  -verbose             debug logging to stderr
  -early-return        try once; if the lock is held, exit 0 without running the command
  -max-retry N         give up waiting after N consecutive API errors (default 0: until -wait)
  -backoff DURATION    cap of the jittered backoff after API errors (default 5s)
Flags (ours):
  -wait DURATION       give up (exit 75) if not acquired within this time (default 0: forever)
  -renew DURATION      renew interval (default TTL/2)
  -kill-signal SIGNAL  signal for the workload's group on loss or stop (default SIGTERM;
                       a SIGTERM/SIGINT sent to lock is passed on as is unless this is set)
  -kill-timeout DURATION  grace before SIGKILL (default 4s; keep it below the task's kill_timeout)
  -config FILE         HCL file with the same settings; flags override it
  -namespace NS        variable namespace (default: the task's)
  -address URL         Nomad address when not running in a task (default: NOMAD_ADDR)
  -upstream-port LABEL record this Nomad port's host:port as the holder's upstream in
                       the lock, for "lock lb add" lifecycle tasks: the next holder's
                       ADD then removes it from the LB even if this instance dies
Flags (load balancer, optional; the same fields as the load_balancer and
health_check blocks of -config):
  -lb-uri URL          the LB API's request collection, e.g. http://lb:8080/baragon/v2/request
  -lb-service-id ID    -lb-base-path PATH    -lb-groups G1,G2    -lb-owners O1,O2
  -lb-port LABEL       Nomad port label whose host:port is registered
  -lb-option K=V       service option with a string value (repeatable)
  -lb-options-json J   service options as a JSON object: lists, numbers, maps
  -lb-template-name T  -lb-domains D1,D2    -lb-additional-paths P1,P2
  -lb-group G          our upstream's group (default "default")
  -lb-rack-id R        our upstream's rackId
  -lb-request-timeout, -lb-poll-interval, -lb-add-deadline, -lb-remove-deadline,
  -lb-recheck-interval DURATION
  -lb-authkey-file F   auth key file (else $SINGLETON_LB_AUTHKEY); never on the command line
  -lb-ca-file F        CA bundle for an https LB
  -health-type http|tcp, -health-path P, -health-port LABEL,
  -health-interval, -health-timeout, -health-grace DURATION

The token comes from NOMAD_TOKEN or $NOMAD_SECRETS_DIR/nomad_token, never from argv.
The workload gets NOMAD_LOCK_PATH and NOMAD_LOCK_FENCE (a fencing token that grows
with every acquisition).

Exit codes: the command's own code (128+N if killed by signal N); 64 config error;
69 Nomad unreachable or API errors; 74 the LB refused the ADD; 75 wait timeout;
76 lock lost; 77 permission
denied (the message prints the ACL policy to apply); 126/127 command not executable/found.
`

// Main is the `lock` binary. It returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "status":
			return runStatus(args[1:], stdout, stderr)
		case "lb":
			return runLB(args[1:], stdout, stderr)
		case "version", "-version", "--version":
			fmt.Fprintln(stdout, "lock", Version)
			return 0
		}
	}
	cfg, err := parseRunArgs(args, stderr)
	if errors.Is(err, errHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "lock: %v\n", err)
		return ExitConfig
	}
	log := newLogger(stderr, cfg.Verbose)

	locker, err := NewLocker(cfg, log, lockclient.HolderFromEnv(os.Getenv))
	if err != nil {
		fmt.Fprintf(stderr, "lock: %v\n", err)
		return ExitConfig
	}

	sigs := make(chan os.Signal, 16)
	forwardable := make(chan os.Signal, 16)
	signal.Notify(sigs)
	go func() {
		for sig := range sigs {
			switch sig {
			case syscall.SIGCHLD, syscall.SIGURG, syscall.SIGPIPE:
				continue // ours, not the workload's
			}
			forwardable <- sig
		}
	}()

	sup := &Supervisor{
		Config: cfg, Locker: locker, Logger: log,
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		Observe: func(ev Event) {
			if ev.Notice {
				log.Warn(ev.Message)
				return
			}
			log.Debug("state", "state", ev.State, "message", ev.Message)
		},
		// Daemons the workload starts stay lock's descendants, and are
		// proven dead before the release.
		Subreaper: true,
	}
	return sup.Run(context.Background(), forwardable)
}

func newLogger(w io.Writer, verbose bool) hclog.Logger {
	level := hclog.Info
	if verbose {
		level = hclog.Debug
	}
	return hclog.New(&hclog.LoggerOptions{Name: "lock", Output: w, Level: level})
}

// NewLocker resolves the endpoint and builds the lease client for cfg; holder
// is written into the lock on acquire.
func NewLocker(cfg Config, log hclog.Logger, holder lockclient.Holder) (*lockclient.Locker, error) {
	ep, err := endpointFor(cfg.Address)
	if cfg.RootSecretsDir != "" {
		ep, err = lockclient.DiscoverRootEndpoint(cfg.RootSecretsDir, os.Getenv)
	}
	if err != nil {
		return nil, err
	}
	log.Debug("nomad endpoint", "endpoint", ep.String())
	switch {
	case cfg.LB != nil:
		holder.Upstream = cfg.LB.Upstream // the next holder removes it from the LB
	case cfg.Upstream != "":
		// -upstream-port: `lock lb add` registers it; the next holder's
		// `lock lb add` swaps it out, whether we stopped cleanly or died.
		holder.Upstream = cfg.Upstream
	}
	return lockclient.New(lockclient.Config{
		Endpoint:  ep,
		Namespace: cfg.Namespace,
		Path:      cfg.Path,
		Timing:    cfg.Timing(),
		Holder:    holder,
		MaxRetry:  cfg.MaxRetry,
		Logger:    log,
	})
}

func endpointFor(address string) (lockclient.Endpoint, error) {
	if address == "" {
		return lockclient.DiscoverEndpoint(os.Getenv)
	}
	getenv := func(k string) string {
		switch k {
		case "NOMAD_UNIX_ADDR", "NOMAD_SECRETS_DIR":
			return "" // an explicit -address wins over the task's socket
		case "NOMAD_ADDR":
			return address
		}
		return os.Getenv(k)
	}
	ep, err := lockclient.DiscoverEndpoint(getenv)
	if err != nil {
		return ep, err
	}
	if tok, err := lockclient.DiscoverEndpoint(os.Getenv); err == nil && ep.Token == "" {
		ep.Token = tok.Token
	}
	return ep, nil
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lock status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	namespace := fs.String("namespace", "", "variable namespace")
	address := fs.String("address", "", "Nomad address when not in a task")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return ExitConfig
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "lock status: give exactly one lock path, e.g. lock status nomad/jobs/web/lock")
		return ExitConfig
	}
	cfg := DefaultConfig()
	cfg.Path, cfg.Namespace, cfg.Address = fs.Arg(0), *namespace, *address
	cfg.Command = []string{"status"}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "lock status: %v\n", err)
		return ExitConfig
	}
	locker, err := NewLocker(cfg, newLogger(stderr, false), lockclient.Holder{})
	if err != nil {
		fmt.Fprintf(stderr, "lock status: %v\n", err)
		return ExitConfig
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := locker.Status(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "lock status: %v\n", err)
		var pe *lockclient.PermissionError
		if errors.As(err, &pe) {
			return ExitPermission
		}
		return ExitInfra
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
		return 0
	}
	printStatus(stdout, st)
	return 0
}

func printStatus(w io.Writer, st lockclient.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	defer tw.Flush()
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t= %s\n", k, v) }
	row("Path", st.Path)
	if !st.Exists {
		row("Held", "false (the variable does not exist)")
		return
	}
	held := fmt.Sprint(st.Held)
	if !st.HeldKnown {
		held = "unknown (Nomad shows lock state only to management tokens)"
	}
	row("Held", held)
	label := "Holder"
	if !st.Held {
		label = "Last holder"
	}
	h := st.Holder
	row(label, h.String())
	if h.AllocID != "" {
		row("Alloc ID", h.AllocID)
	}
	if h.JobID != "" {
		row("Job/Group/Task", strings.Join([]string{h.JobID, h.Group, h.Task}, "/"))
	}
	if h.Hostname != "" {
		row("Host/PID", fmt.Sprintf("%s/%d", h.Hostname, h.PID))
	}
	if h.Upstream != "" {
		row("Upstream", h.Upstream)
	}
	row("Fence", fmt.Sprint(st.Fence))
	row("TTL", st.TTL)
	row("Lock delay", st.LockDelay)
	if !h.AcquiredAt.IsZero() {
		row("Acquired", fmt.Sprintf("%s (%s ago)", h.AcquiredAt.Format(time.RFC3339), time.Since(h.AcquiredAt).Round(time.Second)))
	}
	if !st.ModifiedAt.IsZero() {
		row("Modified", st.ModifiedAt.Format(time.RFC3339))
	}
}
