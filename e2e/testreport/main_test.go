package main

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestSummary(t *testing.T) {
	const pkg = `"Package":"example.com/e2e"`
	at := func(s int) string { return fmt.Sprintf(`"Time":"2026-01-01T00:00:%02dZ"`, s) }
	stream := strings.Join([]string{
		`{` + at(0) + `,"Action":"run",` + pkg + `,"Test":"TestWaits"}`,
		`{` + at(0) + `,"Action":"pause",` + pkg + `,"Test":"TestWaits"}`,
		`{` + at(1) + `,"Action":"run",` + pkg + `,"Test":"TestQuick"}`,
		`{` + at(1) + `,"Action":"output",` + pkg + `,"Test":"TestQuick","Output":"    quick_test.go:9: want 1, got 2\n"}`,
		`{` + at(2) + `,"Action":"fail",` + pkg + `,"Test":"TestQuick","Elapsed":1}`,
		`{` + at(2) + `,"Action":"cont",` + pkg + `,"Test":"TestWaits"}`,
		`{` + at(2) + `,"Action":"run",` + pkg + `,"Test":"TestWaits/sub"}`,
		`{` + at(40) + `,"Action":"pass",` + pkg + `,"Test":"TestWaits/sub","Elapsed":38}`,
		// Elapsed leaves out the wait for parallel subtests: the 38 s count.
		`{` + at(40) + `,"Action":"pass",` + pkg + `,"Test":"TestWaits","Elapsed":0}`,
		`{` + at(41) + `,"Action":"run",` + pkg + `,"Test":"TestSkipped"}`,
		`{` + at(41) + `,"Action":"skip",` + pkg + `,"Test":"TestSkipped","Elapsed":0}`,
		`{` + at(41) + `,"Action":"output",` + pkg + `,"Output":"FAIL\texample.com/e2e\t41.000s\n"}`,
		`{` + at(41) + `,"Action":"fail",` + pkg + `,"Elapsed":41}`,
	}, "\n")
	var out strings.Builder
	r := &report{tier: "e2e", top: true, out: &out, began: time.Now(), buffered: map[key][]string{}, started: map[key]time.Time{}}
	for _, line := range strings.Split(stream, "\n") {
		r.line([]byte(line))
	}
	got := out.String() + r.summary(r.last.Sub(r.first), "1.00 1.00 1.00")
	for _, want := range []string{
		"quick_test.go:9: want 1, got 2\n",              // a failed test's output
		"--- PASS: TestWaits (38s)\n",                   // -top, timed with its subtests
		"FAIL\texample.com/e2e\t41.000s\n",              // the package's result line
		"== e2e: FAIL in 41s (3 tests, 1 skipped; load", // the summary
		"slowest: TestWaits 38s, TestQuick 1s\n",
		"   FAIL e2e TestQuick\n        quick_test.go:9: want 1, got 2\n", // and why
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if r.passed() {
		t.Error("a stream with a failed test passed")
	}
}

func TestStrayLinesWithoutAPackageFail(t *testing.T) {
	r := &report{out: &strings.Builder{}, buffered: map[key][]string{}, started: map[key]time.Time{}}
	r.line([]byte("go: updates to go.mod needed"))
	if r.passed() {
		t.Error("stdin with nothing but an error line passed")
	}
}
