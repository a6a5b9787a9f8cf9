package lbapi

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestFaults(t *testing.T) {
	tests := []struct {
		name   string
		faults Faults
		method string
		check  func(t *testing.T, resp *http.Response, body string, err error)
	}{
		{
			name:   "5xx",
			faults: Faults{ErrorRate: 1, ErrorStatus: 502},
			method: http.MethodGet,
			check: func(t *testing.T, resp *http.Response, body string, err error) {
				if err != nil || resp.StatusCode != 502 {
					t.Fatalf("got %v %v, want 502", resp, err)
				}
			},
		},
		{
			name:   "default status is 503",
			faults: Faults{ErrorRate: 1},
			method: http.MethodGet,
			check: func(t *testing.T, resp *http.Response, body string, err error) {
				if err != nil || resp.StatusCode != 503 {
					t.Fatalf("got %v %v, want 503", resp, err)
				}
			},
		},
		{
			name:   "dropped connection",
			faults: Faults{DropRate: 1},
			method: http.MethodGet,
			check: func(t *testing.T, resp *http.Response, body string, err error) {
				if err == nil {
					t.Fatalf("got HTTP %d, want a transport error", resp.StatusCode)
				}
			},
		},
		{
			name:   "garbage body",
			faults: Faults{GarbageRate: 1},
			method: http.MethodGet,
			check: func(t *testing.T, resp *http.Response, body string, err error) {
				if err != nil || resp.StatusCode != 200 || strings.Contains(body, `"loadBalancerState":"CANCELED"`) {
					t.Fatalf("got %v %q %v, want 200 with garbage", resp, body, err)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Options{})
			mustNoErr(t, e.srv.SetFaults(tc.faults))
			req, _ := http.NewRequest(tc.method, e.uri+"/nope", nil)
			resp, err := e.ts.Client().Do(req)
			var body string
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				body = string(b)
			}
			tc.check(t, resp, body, err)
		})
	}
}

func TestLatencyFault(t *testing.T) {
	e := newEnv(t, Options{})
	mustNoErr(t, e.srv.SetFaults(Faults{Latency: 60 * time.Millisecond}))
	start := time.Now()
	e.get("nope")
	if d := time.Since(start); d < 60*time.Millisecond {
		t.Errorf("answered after %s, want ≥ 60ms", d)
	}
}

// A fault after the handler loses the answer but keeps the state change.
func TestFaultAfterHandleKeepsTheEffect(t *testing.T) {
	for _, f := range []Faults{
		{DropRate: 1, AfterHandle: true},
		{ErrorRate: 1, AfterHandle: true},
		{GarbageRate: 1, AfterHandle: true},
	} {
		e := newEnv(t, Options{})
		mustNoErr(t, e.srv.SetFaults(f))
		req, _ := http.NewRequest(http.MethodPost, e.uri+"?authkey="+testKey, strings.NewReader(reqSpec{id: "r", add: []string{"10.0.0.1:80"}}.json()))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := e.ts.Client().Do(req); err == nil {
			resp.Body.Close()
		}
		mustNoErr(t, e.srv.SetFaults(Faults{}))
		e.mustState("r", stateWaiting, "")
	}
}

// The same seed gives the same fault sequence.
func TestFaultsAreSeeded(t *testing.T) {
	seq := func(seed uint64) string {
		in := newInjector(seed)
		in.set(Faults{ErrorRate: 0.3, DropRate: 0.2, GarbageRate: 0.3})
		var b strings.Builder
		for range 64 {
			f := in.decide()
			b.WriteByte(byte('0' + f.kind))
			b.WriteByte(byte('a' + f.garbage + 1))
		}
		return b.String()
	}
	if seq(7) != seq(7) {
		t.Fatal("same seed, different sequences")
	}
	if seq(7) == seq(8) {
		t.Fatal("different seeds, same sequence")
	}
	if !strings.ContainsAny(seq(7), "123") {
		t.Fatal("no fault drawn")
	}
}

func TestFaultValidation(t *testing.T) {
	e := newEnv(t, Options{})
	for _, f := range []Faults{{ErrorRate: 1.5}, {DropRate: -1}, {Latency: -time.Second}, {ErrorRate: 1, ErrorStatus: 200}} {
		if err := e.srv.SetFaults(f); err == nil {
			t.Errorf("SetFaults(%+v) accepted", f)
		}
	}
}

func TestGarbageBody(t *testing.T) {
	if got := string(garbageBody(-1, []byte(`{"a":"bcd"}`))); got != `{"a":` {
		t.Errorf("truncated = %q", got)
	}
	if got := string(garbageBody(-1, nil)); got != garbageBodies[0] {
		t.Errorf("truncated nothing = %q", got)
	}
}

func TestDropWithoutHijacker(t *testing.T) {
	defer func() {
		if r := recover(); !errors.Is(r.(error), http.ErrAbortHandler) {
			t.Errorf("recovered %v, want http.ErrAbortHandler", r)
		}
	}()
	dropConnection(newBufferedResponse())
	t.Error("dropConnection returned")
}
