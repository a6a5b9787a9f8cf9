package lbapi

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
)

func TestNextTargets(t *testing.T) {
	a, b, c := Target{"10.0.0.1:80", "default"}, Target{"10.0.0.2:80", "default"}, Target{"10.0.0.3:80", "default"}
	aBlue := Target{"10.0.0.1:80", "blue"}
	up := func(ts ...Target) []upstream {
		var out []upstream
		for _, t := range ts {
			out = append(out, upstream{Upstream: t.Upstream, Group: t.Group})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		cur  []Target
		req  request
		want []Target
	}{
		{"add", []Target{a}, request{Add: up(b)}, []Target{a, b}},
		{"add present is one", []Target{a}, request{Add: up(a)}, []Target{a}},
		{"swap", []Target{a}, request{Add: up(b), Remove: up(a)}, []Target{b}},
		{"remove missing is fine", []Target{a}, request{Remove: up(c)}, []Target{a}},
		{"group is part of the identity", []Target{a}, request{Add: up(aBlue)}, []Target{aBlue, a}},
		{"remove matches the group", []Target{a, aBlue}, request{Remove: up(aBlue)}, []Target{a}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := nextTargets(tc.cur, tc.req); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// fakeBackend keeps the served targets in memory; fail, when set, decides
// whether a Sync fails (after applying want when partial is set).
type fakeBackend struct {
	mu      sync.Mutex
	serving map[string][]Target
	fail    func(want []Target) bool
	partial bool
}

func (f *fakeBackend) Name() string { return "fake://lb" }

func (f *fakeBackend) Sync(_ context.Context, svc string, want []Target) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil && f.fail(want) {
		if f.partial {
			f.serving[svc] = slices.Clone(want)
		}
		return errors.New("fake refuses")
	}
	f.serving[svc] = slices.Clone(want)
	return nil
}

func (f *fakeBackend) Serving(_ context.Context, svc string) ([]Target, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.serving[svc]), nil
}

func (f *fakeBackend) upstreams(svc string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, t := range f.serving[svc] {
		out = append(out, t.Upstream)
	}
	return out
}

func newFakeEnv(t *testing.T, f *fakeBackend) *haEnv {
	f.serving = map[string][]Target{}
	return &haEnv{testEnv: newEnv(t, Options{Backend: f, ReconcileInterval: -1})}
}

// TestBackendUndo: what a backend serves follows the requests that reached
// SUCCESS, also when an APPLY is refused after changing part of it, or a
// request is cancelled after its APPLY.
func TestBackendUndo(t *testing.T) {
	t.Run("refused apply is reverted", func(t *testing.T) {
		f := &fakeBackend{partial: true}
		e := newFakeEnv(t, f)
		e.resp(e.post(reqSpec{id: "a", add: []string{"10.0.0.1:80"}}.json()))
		if r := e.finish("a", nil); r.State != stateSuccess {
			t.Fatalf("a ended %s: %s", r.State, r.Message)
		}
		f.mu.Lock()
		f.fail = func(want []Target) bool { return len(want) == 2 }
		f.mu.Unlock()
		e.resp(e.post(reqSpec{id: "b", add: []string{"10.0.0.2:80"}}.json()))
		r := e.finish("b", nil)
		if r.State != stateFailed || !strings.Contains(r.Message, "fake refuses") || !strings.HasSuffix(r.Message, "REVERT OK.") {
			t.Errorf("b ended %s %q, want FAILED quoting the backend, reverted", r.State, r.Message)
		}
		if got := f.upstreams("web"); !slices.Equal(got, []string{"10.0.0.1:80"}) {
			t.Errorf("backend serves %q, want only 10.0.0.1:80", got)
		}
	})
	t.Run("cancel after the apply", func(t *testing.T) {
		f := &fakeBackend{}
		e := newFakeEnv(t, f)
		e.resp(e.post(reqSpec{id: "a", add: []string{"10.0.0.1:80"}}.json()))
		e.steps(2) // PENDING → SEND_APPLY → CHECK_APPLY_RESPONSES
		waitFor(t, "the APPLY to reach the backend", func() bool { return len(f.upstreams("web")) == 1 })
		if r := e.resp(e.del("a")); r.State != stateCanceling {
			t.Fatalf("cancel: %s %s", r.State, r.Message)
		}
		if r := e.finish("a", nil); r.State != stateCanceled {
			t.Errorf("a ended %s: %s", r.State, r.Message)
		}
		if got := f.upstreams("web"); len(got) != 0 {
			t.Errorf("backend serves %q after the cancel, want nothing", got)
		}
		if got := e.srv.Upstreams("web"); len(got) != 0 {
			t.Errorf("committed %q after the cancel", got)
		}
	})
	t.Run("two requests of one service in one batch", func(t *testing.T) {
		f := &fakeBackend{}
		e := newFakeEnv(t, f)
		e.resp(e.post(reqSpec{id: "a", add: []string{"10.0.0.1:80"}}.json()))
		e.finish("a", nil)
		// The service is unchanged, so the worker batches both.
		e.resp(e.post(reqSpec{id: "b", add: []string{"10.0.0.2:80"}}.json()))
		e.resp(e.post(reqSpec{id: "c", add: []string{"10.0.0.3:80"}}.json()))
		for _, id := range []string{"b", "c"} {
			if r := e.finish(id, nil); r.State != stateSuccess {
				t.Fatalf("%s ended %s: %s", id, r.State, r.Message)
			}
		}
		want := []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"}
		if got := f.upstreams("web"); !slices.Equal(got, want) {
			t.Errorf("backend serves %q, want %q", got, want)
		}
		if got := e.srv.Upstreams("web"); !slices.Equal(got, want) {
			t.Errorf("committed %q, want %q", got, want)
		}
	})
}

func TestBackendOptions(t *testing.T) {
	f := &fakeBackend{}
	for _, tc := range []struct {
		name string
		opts Options
		err  string
	}{
		{"unknown backend group", Options{Backend: f, BackendGroups: []string{"nope"}}, `backend group "nope" is not one of the groups`},
		{"groups without backend", Options{BackendGroups: []string{"default"}}, "no backend"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewServer(tc.opts); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("NewServer: %v, want an error containing %q", err, tc.err)
			}
		})
	}
}
