package lbhook

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/proctest"
)

// Every HTTP outcome of every call, classified as in
// docs/lb-contract.md#client-reading-of-outcomes, with our decision (5xx, 408,
// 429 on POST count as UNKNOWN, not FAILED).
func TestCallClassification(t *testing.T) {
	const valid = `{"loadBalancerRequestId":"r1","loadBalancerState":"WAITING","message":"Queued"}`
	type want struct {
		state    RequestState
		notFound bool
	}
	tests := []struct {
		name  string
		act   action
		post  want
		other want // GET and DELETE
	}{
		{"200 valid", answerStatus(200, valid), want{StateWaiting, false}, want{StateWaiting, false}},
		{"200 garbage", answerStatus(200, `<html>oops</html>`), want{StateUnknown, false}, want{StateUnknown, false}},
		{"200 unknown state", answerStatus(200, `{"loadBalancerState":"DONE"}`), want{StateUnknown, false}, want{StateUnknown, false}},
		{"200 truncated body", truncatedBody(), want{StateUnknown, false}, want{StateUnknown, false}},
		{"200 oversized body", answerStatus(200, `{"loadBalancerState":"SUCCESS","message":"`+strings.Repeat("x", maxBodyBytes)+`"}`), want{StateUnknown, false}, want{StateUnknown, false}},
		{"204 empty", answerStatus(204, ""), want{StateUnknown, false}, want{StateUnknown, false}},
		{"302 redirect not followed", func(w http.ResponseWriter, r *http.Request) bool {
			http.Redirect(w, r, "http://elsewhere.example/", http.StatusFound)
			return true
		}, want{StateFailed, false}, want{StateUnknown, false}},
		{"400", answerStatus(400, `{"code":400,"message":"Unable to process JSON"}`), want{StateFailed, false}, want{StateUnknown, false}},
		{"403", answerStatus(403, ""), want{StateFailed, false}, want{StateUnknown, false}},
		{"404", answerStatus(404, ""), want{StateFailed, true}, want{StateUnknown, true}},
		{"408", answerStatus(408, ""), want{StateUnknown, false}, want{StateUnknown, false}},
		{"422", answerStatus(422, `{"errors":["loadBalancerService may not be null"]}`), want{StateFailed, false}, want{StateUnknown, false}},
		{"429", answerStatus(429, ""), want{StateUnknown, false}, want{StateUnknown, false}},
		{"500", answerStatus(500, `{"code":500}`), want{StateUnknown, false}, want{StateUnknown, false}},
		{"503", answerStatus(503, ""), want{StateUnknown, false}, want{StateUnknown, false}},
		{"504", answerStatus(504, ""), want{StateUnknown, false}, want{StateUnknown, false}},
		{"dropped connection", dropConn(), want{StateUnknown, false}, want{StateUnknown, false}},
		{"timeout", func(w http.ResponseWriter, r *http.Request) bool {
			<-r.Context().Done()
			return true
		}, want{StateUnknown, false}, want{StateUnknown, false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFront(nil)
			for _, m := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
				f.on(m, 0, tc.act)
			}
			ts := httptest.NewServer(f)
			defer ts.Close()
			cfg := testConfig(ts.URL + "/baragon/v2/request")
			cfg.RequestTimeout = 100 * time.Millisecond
			c := newTestClient(t, cfg, nil)
			ctx := context.Background()
			calls := map[string]func() (BaragonResponse, error){
				http.MethodPost:   func() (BaragonResponse, error) { return c.Post(ctx, c.NewRequest("r1", nil, nil)) },
				http.MethodGet:    func() (BaragonResponse, error) { return c.Get(ctx, "r1") },
				http.MethodDelete: func() (BaragonResponse, error) { return c.Cancel(ctx, "r1") },
			}
			for method, call := range calls {
				w := tc.other
				if method == http.MethodPost {
					w = tc.post
				}
				resp, err := call()
				if resp.LoadBalancerState != w.state {
					t.Errorf("%s: state %s, want %s (err %v)", method, resp.LoadBalancerState, w.state, err)
				}
				if errors.Is(err, ErrNotFound) != w.notFound {
					t.Errorf("%s: not found = %v, want %v", method, errors.Is(err, ErrNotFound), w.notFound)
				}
				if w.state == StateWaiting {
					if err != nil {
						t.Errorf("%s: %v", method, err)
					}
					continue
				}
				var ce *CallError
				if !errors.As(err, &ce) || ce.State != w.state || resp.Message != err.Error() || resp.LoadBalancerRequestID != "r1" {
					t.Errorf("%s: err %v, response %+v", method, err, resp)
				}
				assertNoSecret(t, method+" error", err.Error())
			}
		})
	}
}

func TestConnectionRefused(t *testing.T) {
	c := newTestClient(t, testConfig(refusedURI(t)), nil)
	ctx := context.Background()
	for name, call := range map[string]func() (BaragonResponse, error){
		"POST":   func() (BaragonResponse, error) { return c.Post(ctx, c.NewRequest("r1", nil, nil)) },
		"GET":    func() (BaragonResponse, error) { return c.Get(ctx, "r1") },
		"DELETE": func() (BaragonResponse, error) { return c.Cancel(ctx, "r1") },
	} {
		resp, err := call()
		if resp.LoadBalancerState != StateUnknown || err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("%s: %s %v", name, resp.LoadBalancerState, err)
		}
		assertNoSecret(t, name+" error", err.Error())
	}
	if _, err := c.ServiceState(ctx); err == nil {
		t.Error("ServiceState: no error")
	}
}

// A 4xx POST carries the status and the body, like Singularity's
// "Response status code N: body", without the key even if the body echoes it.
func TestRejectedPostMessage(t *testing.T) {
	f := newFront(nil).on(http.MethodPost, 0, func(w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(422)
		_, _ = w.Write([]byte(`{"errors":["bad"],"echo":"` + r.URL.RawQuery + `","raw":"` + testKey + `"}`))
		return true
	})
	ts := httptest.NewServer(f)
	defer ts.Close()
	c := newTestClient(t, testConfig(ts.URL+"/baragon/v2/request"), nil)
	resp, err := c.Post(context.Background(), c.NewRequest("r1", nil, nil))
	if err == nil || resp.LoadBalancerState != StateFailed || !strings.Contains(resp.Message, `response status code 422: {"errors":["bad"]`) {
		t.Errorf("got %s %q", resp.LoadBalancerState, resp.Message)
	}
	if !strings.Contains(resp.Message, "authkey=REDACTED") {
		t.Errorf("message %q lacks the redacted URL", resp.Message)
	}
	assertNoSecret(t, "message", resp.Message)
}

func TestServiceState(t *testing.T) {
	l := newLB(t, time.Millisecond)
	c := newTestClient(t, testConfig(l.uri), nil)
	ctx := context.Background()
	if _, err := c.ServiceState(ctx); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown service: %v", err)
	}
	if _, err := c.Run(ctx, c.NewRequest("add1", []UpstreamInfo{{Upstream: "10.0.0.1:80"}}, nil), time.Time{}); err != nil {
		t.Fatal(err)
	}
	st, err := c.ServiceState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Service.ServiceID != "web" || len(st.Upstreams) != 1 || st.Upstreams[0].RequestID != "add1" || st.Upstreams[0].Group != "default" {
		t.Errorf("state %+v", st)
	}
	for _, act := range []action{answerStatus(500, "boom"), answerStatus(200, "garbage")} {
		l.front.on(http.MethodGet, 0, act)
		if _, err := c.ServiceState(ctx); err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("state with a broken answer: %v", err)
		}
	}
}

func TestRedactor(t *testing.T) {
	r := redactor{secret: testKey}
	if got := r.String("a " + testKey + " b " + "s3cr3t%2Bkey%2F%3D%3D"); got != "a REDACTED b REDACTED" {
		t.Errorf("String = %q", got)
	}
	if got := r.URL("http://u:pw@h/x?authkey=" + "s3cr3t%2Bkey%2F%3D%3D" + "&team=a"); got != "http://u:xxxxx@h/x?authkey=REDACTED&team=a" {
		t.Errorf("URL = %q", got)
	}
	if got := (redactor{}).String("plain"); got != "plain" {
		t.Errorf("no secret: %q", got)
	}
}

// The key never reaches the logs, whatever happens.
func TestLogsNeverShowTheKey(t *testing.T) {
	l := newLB(t, time.Millisecond)
	l.front.on(http.MethodPost, 1, answerStatus(503, testKey)).on(http.MethodGet, 1, dropConn())
	var logs proctest.SyncBuffer
	c := newTestClient(t, testConfig(l.uri), &logs)
	resp, err := c.Run(context.Background(), c.NewRequest("r1", []UpstreamInfo{{Upstream: "10.0.0.1:80"}}, nil), time.Time{})
	if err != nil || resp.LoadBalancerState != StateSuccess {
		t.Fatalf("%s %v", resp.LoadBalancerState, err)
	}
	bad := newTestClient(t, testConfig(refusedURI(t)), &logs)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = bad.Run(ctx, bad.NewRequest("r2", nil, nil), time.Time{})
	if err == nil {
		t.Fatal("run against a closed port succeeded")
	}
	assertNoSecret(t, "run error", err.Error())
	if !strings.Contains(logs.String(), "authkey=REDACTED") {
		t.Errorf("logs lack redacted URLs:\n%s", logs.String())
	}
	assertNoSecret(t, "logs", logs.String())
}
