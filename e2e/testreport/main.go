// Command testreport turns the `go test -json` stream of one test tier into
// what a person reads while it runs, and a summary at its end.
//
//	testreport -tier unit [-top] [-v] [-json FILE] [-summary FILE] [-- command args...]
//
// It reads the stream from the command's stdout when one is given (its
// stderr passes through; its failure fails the tier, and a command that is
// not `go test -json`, e.g. `go vet`, is timed and passed through the
// same way), else from stdin.
//
// While the tier runs it prints, as `go test` without -v would, each
// package's result line and the whole output of every test that fails;
// -top adds a line for every top-level test that passes (so a long tier
// shows its progress; skips are counted in the summary), -v prints every line of output as it comes (as `go test
// -v`). Lines on stdin that are not JSON (a build error) pass through.
//
// At the end it prints the tier's summary: its result, wall time (from the
// start of testreport, which runs beside the go command, so compiling is
// included), the load average, every failed test as "FAIL <tier> <test>",
// and the five slowest top-level tests. -summary appends the same block to
// FILE, so that a make target running several tiers can print them all
// together at its end. -json keeps the raw events in FILE.
//
// It exits 1 if the command, any test or any package failed, or if the
// stream held output that was not JSON and no package result (the go
// command failed before it ran anything).
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/e2e/internal/loadavg"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

// key names one test of one package, or the package itself (Test "").
type key struct{ pkg, test string }

type result struct {
	key
	action string // pass, fail, skip
	// took is from the test's start (or, for a parallel test, its resumption)
	// to its end, its parallel subtests included: go test's own Elapsed
	// leaves out the time a test waits for its parallel subtests.
	took time.Duration
}

type report struct {
	tier     string
	top, v   bool
	out      io.Writer
	began    time.Time
	buffered map[key][]string // output of tests still running (without -v)
	// why keeps each test's own failure lines (file_test.go:N: ...), so
	// that the summary says why a test failed, not only which: a CI log
	// keeps its tail, and a failed e2e test's agent logs fill the rest.
	why     map[key][]string
	started map[key]time.Time
	// first and last are the times of the first and last events: a stream
	// replayed from a file is timed by them.
	first, last time.Time
	results     []result
	stray       int    // lines that were not JSON
	failed      bool   // a test, a package or the build failed
	cmdErr      string // the command's failure
	cmdRan      bool   // a command was run (rather than stdin read)
}

func main() {
	tier := flag.String("tier", "tests", "the tier's name, for the summary and every failure line")
	top := flag.Bool("top", false, "print a line for every top-level test that passes")
	verbose := flag.Bool("v", false, "print every line of output as it comes")
	jsonFile := flag.String("json", "", "also write the raw events to this file")
	summaryFile := flag.String("summary", "", "also append the summary to this file")
	flag.Parse()

	r := &report{tier: *tier, top: *top, v: *verbose, out: os.Stdout, began: time.Now(), buffered: map[key][]string{}, started: map[key]time.Time{}}
	var raw io.Writer = io.Discard
	if *jsonFile != "" {
		f, err := os.Create(*jsonFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
			os.Exit(2)
		}
		defer f.Close()
		raw = f
	}
	var in io.Reader = os.Stdin
	var cmd *exec.Cmd
	if args := flag.Args(); len(args) > 0 {
		cmd = exec.Command(args[0], args[1:]...)
		cmd.Stdin, cmd.Stderr = os.Stdin, os.Stderr
		pipe, err := cmd.StdoutPipe()
		if err != nil {
			fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
			os.Exit(2)
		}
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
			os.Exit(2)
		}
		in, r.cmdRan = pipe, true
		// Interrupts reach the command through the terminal's process
		// group; stay alive to print what it did.
		signal.Ignore(os.Interrupt, syscall.SIGTERM)
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		fmt.Fprintf(raw, "%s\n", line)
		r.line(line)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "testreport: read: %v\n", err)
		r.failed = true
	}
	if cmd != nil {
		if err := cmd.Wait(); err != nil {
			r.cmdErr = fmt.Sprintf("%s: %v", strings.Join(cmd.Args, " "), err)
		}
	}
	summary := r.summary(max(time.Since(r.began), r.last.Sub(r.first)), loadavg.Read())
	fmt.Fprint(r.out, summary)
	if *summaryFile != "" {
		if err := appendFile(*summaryFile, summary); err != nil {
			fmt.Fprintf(os.Stderr, "testreport: %v\n", err)
		}
	}
	if !r.passed() {
		os.Exit(1)
	}
}

func (r *report) line(line []byte) {
	var e event
	if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
		r.stray++
		fmt.Fprintf(r.out, "%s\n", line)
		return
	}
	if !e.Time.IsZero() {
		if r.first.IsZero() {
			r.first = e.Time
		}
		r.last = e.Time
	}
	k := key{e.Package, e.Test}
	switch e.Action {
	case "output", "build-output":
		if e.Test != "" && failureLine.MatchString(e.Output) && !strings.Contains(e.Output, " MEASURE ") {
			if r.why == nil {
				r.why = map[key][]string{}
			}
			w := append(r.why[k], clip(strings.TrimSpace(e.Output), 400))
			r.why[k] = w[max(0, len(w)-maxWhy):]
		}
		switch {
		case r.v:
			fmt.Fprint(r.out, e.Output)
		case e.Test != "":
			r.buffered[k] = append(r.buffered[k], e.Output)
		case packageLine(e.Output):
			fmt.Fprint(r.out, e.Output)
		}
	case "run", "cont":
		r.started[k] = e.Time
	case "pass", "fail", "skip":
		took := time.Duration(e.Elapsed * float64(time.Second))
		if began, ok := r.started[k]; ok && !e.Time.IsZero() {
			took = max(took, e.Time.Sub(began))
		}
		r.results = append(r.results, result{k, e.Action, took})
		if e.Action == "fail" {
			r.failed = true
		}
		if e.Test == "" {
			return
		}
		if e.Action == "fail" && !r.v {
			fmt.Fprint(r.out, strings.Join(r.buffered[k], ""))
		}
		delete(r.buffered, k)
		if r.top && !r.v && !strings.Contains(e.Test, "/") && e.Action == "pass" {
			fmt.Fprintf(r.out, "--- PASS: %s (%s)\n", e.Test, round(took))
		}
	case "build-fail":
		r.failed = true
	}
}

// packageLine reports whether a line of a package's own output (not a
// test's) is one `go test` prints without -v: not the RUN/PAUSE/CONT
// chatter of test2json's verbose mode, nor the bare PASS.
func packageLine(s string) bool {
	for _, p := range []string{"=== ", "PASS\n", "--- PASS", "--- SKIP"} {
		if strings.HasPrefix(s, p) {
			return false
		}
	}
	return true
}

func (r *report) passed() bool {
	if r.cmdErr != "" || r.failed {
		return false
	}
	// Stdin that is not `go test -json` output and holds no package result
	// is a go command that failed before running anything; a command's own
	// exit status says that.
	ranAny := slices.ContainsFunc(r.results, func(x result) bool { return x.test == "" })
	return ranAny || r.stray == 0 || r.cmdRan
}

// summary is the block printed at the end, e.g.
//
//	== e2e-smoke: PASS in 4m12s (41 tests, 3 skipped; load 2.10 1.95 1.40)
//	   slowest: TestGate 3m1s, TestLB 1m2s, ...
func (r *report) summary(wall time.Duration, load string) string {
	var b strings.Builder
	var tests, skipped int
	var failed []string
	var top []result
	for _, x := range r.results {
		if x.test == "" {
			if x.action == "fail" && !slices.ContainsFunc(r.results, func(y result) bool {
				return y.pkg == x.pkg && y.test != "" && y.action == "fail"
			}) {
				failed = append(failed, x.pkg+" (the package: build, TestMain, panic or timeout; its output is above)")
			}
			continue
		}
		if !strings.Contains(x.test, "/") {
			tests++
			if x.action == "skip" {
				skipped++
			}
			if x.action != "skip" {
				top = append(top, x)
			}
		}
		if x.action == "fail" {
			f := r.name(x.key)
			for _, w := range r.why[x.key] {
				f += "\n        " + w
			}
			failed = append(failed, f)
		}
	}
	status := "PASS"
	if !r.passed() {
		status = "FAIL"
	}
	counts := ""
	if tests > 0 {
		counts = fmt.Sprintf("%d tests, %d skipped; ", tests, skipped)
	}
	fmt.Fprintf(&b, "== %s: %s in %s (%sload %s)\n", r.tier, status, round(wall), counts, load)
	slices.SortStableFunc(top, func(x, y result) int { return cmp.Compare(y.took, x.took) })
	if len(top) > 0 {
		var slow []string
		for _, x := range top[:min(5, len(top))] {
			slow = append(slow, fmt.Sprintf("%s %s", r.name(x.key), round(x.took)))
		}
		fmt.Fprintf(&b, "   slowest: %s\n", strings.Join(slow, ", "))
	}
	for _, f := range failed {
		fmt.Fprintf(&b, "   FAIL %s %s\n", r.tier, f)
	}
	if status == "FAIL" && len(failed) == 0 {
		why := "the go command failed before any package ran"
		if r.cmdErr != "" {
			why = r.cmdErr
		}
		fmt.Fprintf(&b, "   FAIL %s: %s (its output is above)\n", r.tier, why)
	}
	return b.String()
}

// name is the test's name, with its package's last element unless that is
// the only package seen (the e2e tiers' main package).
func (r *report) name(k key) string {
	pkgs := map[string]bool{}
	for _, x := range r.results {
		pkgs[x.pkg] = true
	}
	if len(pkgs) <= 1 || k.pkg == "" {
		return k.test
	}
	return k.pkg[strings.LastIndex(k.pkg, "/")+1:] + "." + k.test
}

// maxWhy is how many of a test's last lines of its own the summary keeps:
// t.Fatal's is the last.
const maxWhy = 4

// failureLine is a line a test wrote through t.Error, t.Fatal or t.Log from
// a _test.go file: its own words (the harness's agent logs come from its
// log writer, not a _test.go file). Each line is one test's one report.
var failureLine = regexp.MustCompile(`^\s+[\w.-]+_test\.go:\d+: |^panic: `)

// clip shortens s to at most n bytes, saying that it did.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + " […]"
}

func round(d time.Duration) time.Duration {
	if d >= time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(100 * time.Millisecond)
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
