package harness

import (
	"slices"
	"strings"
	"sync"
	"testing"
)

// Two tiers of e2e tests. `make e2e` runs every test. `make test` runs the
// module with -short: the smoke tier, one quick scenario on real agents of
// every mode a user picks. With -short, a test is in the smoke tier only if
// it, or a test above it, called Smoke; StartAgent and StartDocker skip
// every other test (so a new test is in the full tier unless it says
// otherwise, and the smoke tier cannot grow by accident), and
// SkipOutsideSmoke skips the subtests that a smoke test left out.
//
// The names live beside the tests, and a name Smoke lists that never ran
// fails the test: renaming a subtest cannot silently drop it from the tier.

var smokeTier = struct {
	sync.Mutex
	// marked maps a test's full name to the subtests of it that are in the
	// tier (nil: all of them).
	marked map[string][]string
	// seen holds the full names of the subtests SkipOutsideSmoke was asked
	// about.
	seen map[string]bool
}{marked: map[string][]string{}, seen: map[string]bool{}}

// Smoke puts t in the smoke tier (make test), with all its subtests or, if
// subtests are named (as t.Run names them: spaces become underscores), with
// those alone. It does nothing without -short. Call it first thing in the
// test, before StartAgent.
func Smoke(t testing.TB, subtests ...string) {
	t.Helper()
	if !testing.Short() {
		return
	}
	var names []string
	if len(subtests) > 0 {
		names = slices.Clone(subtests)
	}
	smokeTier.Lock()
	smokeTier.marked[t.Name()] = names
	smokeTier.Unlock()
	if len(subtests) == 0 {
		return
	}
	t.Cleanup(func() {
		smokeTier.Lock()
		defer smokeTier.Unlock()
		for _, s := range subtests {
			if !smokeTier.seen[t.Name()+"/"+s] && !t.Failed() && !t.Skipped() {
				t.Errorf("harness.Smoke(%s) names the subtest %q, which did not run: a subtest renamed? "+
					"Name it as t.Run does, and have each subtest call harness.SkipOutsideSmoke", t.Name(), s)
			}
		}
	})
}

// InSmoke reports whether t runs in this tier: always without -short; with
// it, if t or a test above it is in the smoke tier (see Smoke).
func InSmoke(t testing.TB) bool {
	if !testing.Short() {
		return true
	}
	smokeTier.Lock()
	defer smokeTier.Unlock()
	return inSmoke(smokeTier.marked, t.Name())
}

// inSmoke decides for the test named name (a/b/c) from the marks: the
// nearest marked test at or above it decides.
func inSmoke(marked map[string][]string, name string) bool {
	parts := strings.Split(name, "/")
	for i := len(parts); i >= 1; i-- {
		subs, ok := marked[strings.Join(parts[:i], "/")]
		if !ok {
			continue
		}
		return i == len(parts) || subs == nil || slices.Contains(subs, parts[i])
	}
	return false
}

// SkipOutsideSmoke skips t when it is not in this tier (see InSmoke). Call
// it first thing in a subtest of a test that Smoke names a subset of
// (runConcurrently does it for every subtest it runs).
func SkipOutsideSmoke(t testing.TB) {
	t.Helper()
	if !testing.Short() {
		return
	}
	smokeTier.Lock()
	smokeTier.seen[t.Name()] = true
	in := inSmoke(smokeTier.marked, t.Name())
	smokeTier.Unlock()
	if !in {
		t.Skip("not in the smoke tier (go test -short, make test): make e2e runs it")
	}
}
