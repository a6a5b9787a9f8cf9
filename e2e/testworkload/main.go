// Command testworkload is the workload that the nomad-driver-singleton
// end-to-end tests run under Nomad, `nomad var lock`, the `lock` binary and
// the singleton driver.
//
// It is deliberately tiny, has no dependencies beyond golang.org/x/sys and is
// built with CGO_ENABLED=0, so the same binary also runs inside an exec-driver
// chroot.
//
// Every event is appended as one JSON line to the record file (-record, or
// $TESTWORKLOAD_RECORD), using a single write on an O_APPEND descriptor, so
// many processes may share one file. Timestamps are CLOCK_MONOTONIC
// nanoseconds, which every process on the host shares, plus wall time. The
// harness package (e2e/harness) parses the file with ReadRecords.
//
// Each record carries a random per-process "instance" ID; pair records by it,
// not by PID: under the exec driver the workload is PID 1 in its own PID
// namespace, so the recorded pid is not the host PID.
//
// Events:
//
//	start   the process started (role "main", or "child" for grandchildren)
//	stop    SIGTERM or SIGINT arrived and the process is exiting with code 0
//	signal  any other handled signal arrived (or SIGTERM/SIGINT under -ignore-term)
//	exit    the process exits on its own because of -exit
//
// Behaviour:
//
//	testworkload [flags] [args...]
//
//	-record PATH   record file (default $TESTWORKLOAD_RECORD; empty: no records)
//	-marker S      ignored; lets tests find this process by its argv
//	-ignore-term   record SIGTERM/SIGINT but keep running (only SIGKILL ends it)
//	-exit N        exit with code N (after -after) instead of running until signalled
//	-after D       delay before -exit takes effect (Go duration, default 0)
//	-children N    start N grandchildren (this binary re-executed with -child)
//	-daemon        start the grandchildren as daemons: each in a session of its
//	               own (setsid), detached from our stdio, so they leave the
//	               process group and outlive us
//	-stop-after D  on SIGTERM/SIGINT, take D to "flush" before the stop record
//	               and exit 0 (a slow graceful shutdown)
//	-http ADDR     serve HTTP on ADDR (host:port) until stopped: every request is
//	               answered 200 "alloc <NOMAD_ALLOC_ID>\n". The listener is open
//	               before the start record is written; a listen error exits 2.
//
// Positional arguments are not interpreted; they are recorded in argv so tests
// can check that arguments arrive unchanged.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// record is one line of the record file. The harness's Record type mirrors it.
type record struct {
	Event    string   `json:"event"`
	Instance string   `json:"instance"`
	Mono     int64    `json:"mono"`
	Wall     string   `json:"wall"`
	PID      int      `json:"pid"`
	PPID     int      `json:"ppid"`
	PGID     int      `json:"pgid"`
	Role     string   `json:"role"`
	AllocID  string   `json:"alloc_id,omitempty"`
	Fence    string   `json:"fence,omitempty"`
	LockPath string   `json:"lock_path,omitempty"`
	Signal   string   `json:"signal,omitempty"`
	Ignored  bool     `json:"ignored,omitempty"`
	Code     *int     `json:"code,omitempty"`
	Argv     []string `json:"argv"`
}

// handledSignals are caught and recorded. SIGURG (used by the Go runtime for
// preemption) and SIGCHLD are deliberately absent.
var handledSignals = []os.Signal{
	syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGWINCH,
}

type workload struct {
	role     string
	instance string   // random per process: PIDs repeat across PID namespaces
	out      *os.File // record file; nil means no records
}

func main() {
	var (
		recordPath = flag.String("record", os.Getenv("TESTWORKLOAD_RECORD"), "append JSON event records to this file")
		_          = flag.String("marker", "", "ignored; lets tests find this process by argv")
		ignoreTerm = flag.Bool("ignore-term", false, "record SIGTERM/SIGINT but keep running")
		exitCode   = flag.Int("exit", -1, "exit with this code instead of running until signalled")
		after      = flag.Duration("after", 0, "delay before -exit takes effect")
		children   = flag.Int("children", 0, "number of grandchildren to start")
		child      = flag.Bool("child", false, "internal: run as a grandchild")
		httpAddr   = flag.String("http", "", "serve HTTP on this host:port until stopped")
		daemon     = flag.Bool("daemon", false, "start the grandchildren in their own sessions, detached")
		stopAfter  = flag.Duration("stop-after", 0, "on SIGTERM/SIGINT, wait this long before the stop record and exit")
		eatMB      = flag.Int("eat-mb", 0, "after the start record, allocate and touch this many MiB and hold them")
		lockEnv    = flag.String("lock-env", "", "read NOMAD_LOCK_* from this NAME=value file (a gate's nomad-lock.env) before the start record")
	)
	flag.Parse()
	if *lockEnv != "" {
		if err := loadLockEnv(*lockEnv); err != nil {
			fmt.Fprintf(os.Stderr, "testworkload: %v\n", err)
			os.Exit(2)
		}
	}

	// Catch signals before anything else, so that none arriving right after
	// start is lost or kills us with the default action.
	sigCh := make(chan os.Signal, 16)
	signal.Notify(sigCh, handledSignals...)

	w := &workload{role: "main", instance: newInstanceID()}
	if *child {
		w.role = "child"
	}
	if *recordPath != "" {
		f, err := os.OpenFile(*recordPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testworkload: open record file: %v\n", err)
			os.Exit(2)
		}
		w.out = f
	}

	if *httpAddr != "" && !*child {
		if err := serveHTTP(*httpAddr); err != nil {
			fmt.Fprintf(os.Stderr, "testworkload: %v\n", err)
			os.Exit(2)
		}
	}

	w.write(record{Event: "start"})
	fmt.Fprintf(os.Stdout, "testworkload started role=%s pid=%d alloc=%s fence=%s\n",
		w.role, os.Getpid(), os.Getenv("NOMAD_ALLOC_ID"), os.Getenv("NOMAD_LOCK_FENCE"))

	if !*child {
		for i := 0; i < *children; i++ {
			if err := startChild(*recordPath, *ignoreTerm, *daemon); err != nil {
				fmt.Fprintf(os.Stderr, "testworkload: start child: %v\n", err)
				os.Exit(2)
			}
		}
	}

	heldMemory = eat(*eatMB)

	var exitTimer <-chan time.Time
	if *exitCode >= 0 {
		exitTimer = time.After(*after)
	}

	for {
		select {
		case <-exitTimer:
			code := *exitCode
			w.write(record{Event: "exit", Code: &code})
			os.Exit(code)
		case sig := <-sigCh:
			name := unix.SignalName(sig.(syscall.Signal))
			isTerm := sig == syscall.SIGTERM || sig == syscall.SIGINT
			switch {
			case isTerm && !*ignoreTerm:
				if *stopAfter > 0 {
					w.write(record{Event: "signal", Signal: name})
					time.Sleep(*stopAfter)
				}
				code := 0
				w.write(record{Event: "stop", Signal: name, Code: &code})
				os.Exit(0)
			default:
				w.write(record{Event: "signal", Signal: name, Ignored: isTerm})
			}
		}
	}
}

// serveHTTP listens on addr and answers every request 200 "alloc <id>" in
// the background, for health checks and load balancer tests.
func serveHTTP(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen -http %s: %w", addr, err)
	}
	body := "alloc " + os.Getenv("NOMAD_ALLOC_ID") + "\n"
	srv := &http.Server{
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
			rw.Header().Set("Content-Type", "text/plain")
			_, _ = rw.Write([]byte(body))
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// startChild re-executes this binary as a grandchild in the same process
// group. The child is reaped in the background so that it never lingers as a
// zombie while we live.
func startChild(recordPath string, ignoreTerm, daemon bool) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{"-child", "-record", recordPath}
	if ignoreTerm {
		args = append(args, "-ignore-term")
	}
	// Pass our own arguments through, so markers in argv match children too.
	args = append(args, "--")
	args = append(args, os.Args[1:]...)
	cmd := exec.Command(self, args...)
	if daemon {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		cmd.Stdout = os.Stdout
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }()
	return nil
}

// newInstanceID returns 16 random hex digits identifying this process in the
// records. PIDs cannot: under the exec driver every task is PID 1 in its own
// PID namespace.
func newInstanceID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		fmt.Fprintf(os.Stderr, "testworkload: random: %v\n", err)
		os.Exit(2)
	}
	return hex.EncodeToString(b[:])
}

// write appends one record with a single write(2). Errors are fatal: a test
// that cannot trust its records must not pass.
func (w *workload) write(r record) {
	if w.out == nil {
		return
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		fmt.Fprintf(os.Stderr, "testworkload: clock_gettime: %v\n", err)
		os.Exit(2)
	}
	r.Instance = w.instance
	r.Mono = ts.Nano()
	r.Wall = time.Now().UTC().Format(time.RFC3339Nano)
	r.PID = os.Getpid()
	r.PPID = os.Getppid()
	r.PGID, _ = syscall.Getpgid(0)
	r.Role = w.role
	r.AllocID = os.Getenv("NOMAD_ALLOC_ID")
	r.Fence = os.Getenv("NOMAD_LOCK_FENCE")
	r.LockPath = os.Getenv("NOMAD_LOCK_PATH")
	r.Argv = os.Args
	line, err := json.Marshal(r)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testworkload: marshal record: %v\n", err)
		os.Exit(2)
	}
	if _, err := w.out.Write(append(line, '\n')); err != nil {
		fmt.Fprintf(os.Stderr, "testworkload: write record: %v\n", err)
		os.Exit(2)
	}
}

// heldMemory keeps what -eat-mb allocated reachable until the process ends.
var heldMemory [][]byte

// eat allocates mb MiB one at a time and writes every page, so the memory is
// charged to the process's memory cgroup (an OOM test goes over its limit).
func eat(mb int) [][]byte {
	var held [][]byte
	for i := 0; i < mb; i++ {
		b := make([]byte, 1<<20)
		for j := 0; j < len(b); j += 4096 {
			b[j] = 1
		}
		held = append(held, b)
	}
	return held
}

// loadLockEnv sets the NOMAD_LOCK_* variables that path names, one
// NAME=value a line.
func loadLockEnv(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read -lock-env: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if ok && strings.HasPrefix(k, "NOMAD_LOCK_") {
			_ = os.Setenv(k, v)
		}
	}
	return nil
}
