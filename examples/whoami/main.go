// Command whoami is the demo workload: an HTTP server that answers every
// request with the Nomad allocation it runs in, so that `curl` through the
// load balancer shows which instance holds the lock.
//
//	whoami -listen 127.0.0.1:${NOMAD_PORT_http}
//
// GET /healthz answers "ok" (for the health_check block); any other path
// answers "alloc <NOMAD_ALLOC_ID> fence <NOMAD_LOCK_FENCE>". On SIGINT or
// SIGTERM it stops taking connections, lets requests in flight finish (up to
// 5 s) and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil))
}

// run serves until ctx ends and returns the exit code. ready, if set,
// receives the address it listens on.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready chan<- string) int {
	fs := flag.NewFlagSet("whoami", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve HTTP on")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 64
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "whoami: %v\n", err)
		return 69
	}
	srv := &http.Server{Handler: handler(getenv), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(stderr, "whoami: alloc %s serving on %s\n", getenv("NOMAD_ALLOC_ID"), ln.Addr())
	if ready != nil {
		ready <- ln.Addr().String()
	}
	select {
	case err := <-served:
		fmt.Fprintf(stderr, "whoami: %v\n", err)
		return 1
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		fmt.Fprintf(stderr, "whoami: shutdown: %v\n", err)
		return 1
	}
	fmt.Fprintln(stderr, "whoami: stopped")
	return 0
}

// handler answers /healthz with "ok" and anything else with who we are.
func handler(getenv func(string) string) http.Handler {
	alloc, fence := getenv("NOMAD_ALLOC_ID"), getenv("NOMAD_LOCK_FENCE")
	if alloc == "" {
		alloc = "(not under Nomad)"
	}
	if fence == "" {
		fence = "-"
	}
	who := fmt.Sprintf("alloc %s fence %s\n", alloc, fence)
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, who)
	})
	return mux
}
