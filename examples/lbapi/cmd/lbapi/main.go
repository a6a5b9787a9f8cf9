// Command lbapi runs the reference LB API server (package lbapi): a stand-in
// for Baragon that keeps its request contract, for the demo and for trying
// a load_balancer block without Baragon.
//
//	lbapi -listen 127.0.0.1:8080 -groups default,prod-lb -authkeys-file keys.txt
//
// The request collection is then http://127.0.0.1:8080/baragon/v2/request.
// Auth keys come from -authkeys-file (one per line; blank lines and # lines
// are skipped), never from argv; with no file, auth is off.
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
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/examples/lbapi"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr, waitForSignal))
}

func waitForSignal() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	<-ch
}

// run parses args, serves until wait returns, and returns the exit code.
func run(args []string, stderr io.Writer, wait func()) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "lbapi: %v\n", err)
		return 64
	}
	cfg.opts.Logger = hclog.New(&hclog.LoggerOptions{Name: "lbapi", Output: stderr, Level: hclog.Info})
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
	listen string
	opts   lbapi.Options
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var (
		cfg        config
		groups     string
		keysFile   string
		ha         lbapi.HAProxyOptions
		haBackends string
		haGroups   string
	)
	fs := flag.NewFlagSet("lbapi", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:8080", "address to listen on")
	fs.StringVar(&groups, "groups", lbapi.DefaultGroup, "existing load balancer groups, comma-separated")
	fs.StringVar(&keysFile, "authkeys-file", "", "file of auth keys, one per line; none disables auth")
	fs.DurationVar(&cfg.opts.WorkerInterval, "worker-interval", time.Second, "worker period (Baragon: 1s)")
	fs.StringVar(&ha.Socket, "haproxy-socket", "", "HAProxy admin socket (stats socket … level admin): drive that HAProxy")
	fs.StringVar(&haBackends, "haproxy-backends", "", "serviceId=backend pairs, comma-separated (default backend: the serviceId, sanitised)")
	fs.StringVar(&haGroups, "haproxy-groups", "", "groups HAProxy serves, comma-separated (default all)")
	fs.DurationVar(&cfg.opts.ReconcileInterval, "reconcile-interval", lbapi.DefaultReconcileInterval, "how often HAProxy is checked and repaired (negative: only on GET /state)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q (auth keys go in -authkeys-file)", fs.Args())
	}
	for _, g := range splitList(groups) {
		cfg.opts.Groups = append(cfg.opts.Groups, lbapi.Group{Name: g})
	}
	if len(cfg.opts.Groups) == 0 {
		return config{}, errors.New("-groups: at least one group is needed")
	}
	if keysFile != "" {
		var err error
		if cfg.opts.AuthKeys, err = readAuthKeys(keysFile); err != nil {
			return config{}, err
		}
	}
	if ha.Socket == "" {
		if haBackends != "" || haGroups != "" {
			return config{}, errors.New("-haproxy-backends and -haproxy-groups need -haproxy-socket")
		}
		return cfg, nil
	}
	var err error
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

// readAuthKeys reads auth keys, one per line; blank lines and lines
// starting with # are skipped.
func readAuthKeys(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-authkeys-file: %w", err)
	}
	var keys []string
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			keys = append(keys, line)
		}
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
