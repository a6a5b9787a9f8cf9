// Command lbapi runs the reference LB API server (package lbapi): a stand-in
// for Baragon that keeps its request contract.
//
//	lbapi -listen 127.0.0.1:8080 -groups default,prod-lb=2 -authkeys-file keys.txt
//
// The request collection is then http://127.0.0.1:8080/baragon/v2/request.
// Auth keys come from -authkeys-file (one per line) and from the
// LBAPI_AUTHKEYS environment variable (comma-separated), never from argv; with
// no key, auth is off. Fault flags inject latency, 5xx answers, dropped
// connections and garbage bodies, reproducibly from -seed.
//
// With -haproxy-socket, a running HAProxy is the load balancer of the groups
// in -haproxy-groups (default: all): each request's upstream changes re-point
// server slots of the service's HAProxy backend (named after the serviceId,
// or as -haproxy-backends maps it; it needs `server-template slot 1-8
// 127.0.0.1:1 disabled`), a request succeeds only once HAProxy serves the
// change, and what HAProxy lost (say, in a restart) is put back every
// -reconcile-interval:
//
//	haproxy -db -f haproxy.cfg &     # stats socket /run/lbapi/admin.sock level admin; backend web with slots
//	lbapi -groups web-lb -haproxy-socket /run/lbapi/admin.sock
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
)

// authKeysEnv holds extra auth keys, comma-separated.
const authKeysEnv = "LBAPI_AUTHKEYS"

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stderr, waitForSignal))
}

func waitForSignal() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	<-ch
}

// run parses args, serves until wait returns, and returns the exit code.
func run(args []string, getenv func(string) string, stderr io.Writer, wait func()) int {
	cfg, err := parseFlags(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "lbapi: %v\n", err)
		return 64
	}
	cfg.opts.Logger = hclog.New(&hclog.LoggerOptions{Name: "lbapi", Output: stderr, Level: hclog.LevelFromString(cfg.logLevel)})
	srv, err := lbapi.NewServer(cfg.opts)
	if err != nil {
		fmt.Fprintf(stderr, "lbapi: %v\n", err)
		return 64
	}
	base, err := srv.Start(cfg.listen)
	if err != nil {
		fmt.Fprintf(stderr, "lbapi: %v\n", err)
		_ = srv.Close()
		return 69
	}
	fmt.Fprintf(stderr, "lbapi: request collection at %s\n", srv.RequestURL(base))
	if be, ok := cfg.opts.Backend.(*lbapi.HAProxyBackend); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		version, err := be.Version(ctx)
		cancel()
		if err != nil {
			// Not fatal: the reconcile loop catches up once it answers.
			fmt.Fprintf(stderr, "lbapi: warning: HAProxy does not answer yet: %v\n", err)
		} else {
			fmt.Fprintf(stderr, "lbapi: driving HAProxy %s through %s\n", version, be.Name())
		}
	}
	wait()
	if err := srv.Close(); err != nil {
		fmt.Fprintf(stderr, "lbapi: %v\n", err)
		return 1
	}
	return 0
}

// config is what the flags produce.
type config struct {
	listen   string
	logLevel string
	opts     lbapi.Options
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var (
		cfg          config
		groups       string
		keysFile     string
		faultMethods string
		seed         uint64
		ha           lbapi.HAProxyOptions
		haBackends   string
		haGroups     string
	)
	fs := flag.NewFlagSet("lbapi", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:8080", "address to listen on")
	fs.StringVar(&cfg.opts.BasePath, "base-path", lbapi.DefaultBasePath, "application context path")
	fs.StringVar(&groups, "groups", lbapi.DefaultGroup, "existing load balancer groups, comma-separated: name or name=agents")
	fs.StringVar(&keysFile, "authkeys-file", "", "file of auth keys, one per line (also $"+authKeysEnv+", comma-separated); none disables auth")
	fs.DurationVar(&cfg.opts.WorkerInterval, "worker-interval", time.Second, "worker period (Baragon: 1s)")
	fs.IntVar(&cfg.opts.MaxRequestsPerPoll, "max-requests-per-poll", lbapi.DefaultMaxRequestsPerPoll, "requests handled per worker run")
	fs.IntVar(&cfg.opts.MaxBatchSize, "max-batch-size", lbapi.DefaultMaxBatchSize, "agent requests sent per worker run")
	fs.IntVar(&cfg.opts.HistoryPerService, "history-per-service", lbapi.DefaultHistoryPerService, "finished responses kept per service")
	fs.DurationVar(&cfg.opts.Faults.Latency, "latency", 0, "fault: delay added to every request")
	fs.Float64Var(&cfg.opts.Faults.ErrorRate, "error-rate", 0, "fault: fraction of requests answered -error-status")
	fs.IntVar(&cfg.opts.Faults.ErrorStatus, "error-status", 503, "fault: status of injected errors")
	fs.Float64Var(&cfg.opts.Faults.DropRate, "drop-rate", 0, "fault: fraction of connections closed without an answer")
	fs.Float64Var(&cfg.opts.Faults.GarbageRate, "garbage-rate", 0, "fault: fraction of requests answered 200 with a garbage body")
	fs.BoolVar(&cfg.opts.Faults.AfterHandle, "fault-after-handle", false, "fault: apply errors, drops and garbage after the request took effect")
	fs.StringVar(&faultMethods, "fault-methods", "", "fault: only these HTTP methods, comma-separated (default all)")
	fs.Uint64Var(&seed, "seed", 1, "seed of the fault generator")
	fs.StringVar(&cfg.logLevel, "log-level", "info", "trace, debug, info, warn or error")
	fs.StringVar(&ha.Socket, "haproxy-socket", "", "HAProxy admin socket (stats socket … level admin): drive that HAProxy")
	fs.StringVar(&haBackends, "haproxy-backends", "", "serviceId=backend pairs, comma-separated (default backend: the serviceId, sanitised)")
	fs.StringVar(&haGroups, "haproxy-groups", "", "groups HAProxy serves, comma-separated (default all)")
	fs.DurationVar(&cfg.opts.ReconcileInterval, "reconcile-interval", lbapi.DefaultReconcileInterval, "how often HAProxy is checked and repaired (negative: only on GET /state)")
	fs.DurationVar(&ha.DrainTimeout, "haproxy-drain-timeout", lbapi.DefaultDrainTimeout, "how long a change waits for the requests of a server it took out of rotation")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q (auth keys go in -authkeys-file or $%s)", fs.Args(), authKeysEnv)
	}
	cfg.opts.Seed = seed
	var err error
	if cfg.opts.Groups, err = parseGroups(groups); err != nil {
		return config{}, err
	}
	if cfg.opts.AuthKeys, err = authKeys(keysFile, getenv); err != nil {
		return config{}, err
	}
	cfg.opts.Faults.Methods = splitList(faultMethods)
	if ha.Socket == "" {
		if haBackends != "" || haGroups != "" {
			return config{}, errors.New("-haproxy-backends and -haproxy-groups need -haproxy-socket")
		}
		return cfg, nil
	}
	if ha.Backends, err = parsePairs(haBackends); err != nil {
		return config{}, fmt.Errorf("-haproxy-backends: %w", err)
	}
	backend, err := lbapi.NewHAProxyBackend(ha)
	if err != nil {
		return config{}, err
	}
	cfg.opts.Backend = backend
	cfg.opts.BackendGroups = splitList(haGroups)
	return cfg, nil
}

// parsePairs reads "a=x,b=y".
func parsePairs(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range splitList(s) {
		k, v, ok := strings.Cut(item, "=")
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("%q is not serviceId=backend", item)
		}
		out[k] = v
	}
	return out, nil
}

// parseGroups reads "a,b=3": groups a (1 agent) and b (3 agents).
func parseGroups(s string) ([]lbapi.Group, error) {
	var out []lbapi.Group
	for _, item := range splitList(s) {
		name, count, hasCount := strings.Cut(item, "=")
		g := lbapi.Group{Name: name, Agents: 1}
		if hasCount {
			n, err := strconv.Atoi(count)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("-groups: %q: agents must be a positive number", item)
			}
			g.Agents = n
		}
		out = append(out, g)
	}
	if len(out) == 0 {
		return nil, errors.New("-groups: at least one group is needed")
	}
	return out, nil
}

func authKeys(file string, getenv func(string) string) ([]string, error) {
	keys := splitList(getenv(authKeysEnv))
	if file != "" {
		fromFile, err := lbapi.ReadAuthKeysFile(file)
		if err != nil {
			return nil, err
		}
		keys = append(keys, fromFile...)
	}
	return keys, nil
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if p := strings.TrimSpace(part); p != "" {
			out = append(out, p)
		}
	}
	return out
}
