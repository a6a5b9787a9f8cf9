package lbapi

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The background worker drives requests, Start serves, Close is graceful.
func TestStartAndBackgroundWorker(t *testing.T) {
	srv, err := NewServer(Options{WorkerInterval: 5 * time.Millisecond})
	mustNoErr(t, err)
	base, err := srv.Start("127.0.0.1:0")
	mustNoErr(t, err)
	if _, err := srv.Start("127.0.0.1:0"); err == nil {
		t.Error("second Start succeeded")
	}
	uri := srv.RequestURL(base)
	if uri != base+"/baragon/v2/request" {
		t.Fatalf("RequestURL = %s", uri)
	}
	resp, err := http.Post(uri, "application/json", strings.NewReader(reqSpec{id: "bg", add: []string{"10.0.0.1:80"}}.json()))
	mustNoErr(t, err)
	resp.Body.Close()
	waitFor(t, "SUCCESS", func() bool { s, _ := srv.RequestState("bg"); return s == stateSuccess })

	srv.Pause()
	resp, err = http.Post(uri, "application/json", strings.NewReader(reqSpec{id: "paused", add: []string{"10.0.0.2:80"}}.json()))
	mustNoErr(t, err)
	resp.Body.Close()
	time.Sleep(30 * time.Millisecond)
	if s, _ := srv.RequestState("paused"); s != stateWaiting {
		t.Errorf("paused worker advanced a request to %s", s)
	}
	srv.Resume()
	waitFor(t, "SUCCESS after Resume", func() bool { s, _ := srv.RequestState("paused"); return s == stateSuccess })

	mustNoErr(t, srv.Close())
	mustNoErr(t, srv.Close())
	if _, err := http.Get(uri); err == nil {
		t.Error("server still answers after Close")
	}
	if _, err := srv.Start("127.0.0.1:0"); err == nil {
		t.Error("Start after Close succeeded")
	}
}

func TestOptionsValidation(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"duplicate group", Options{Groups: []Group{{Name: "a"}, {Name: "a"}}}, `"a" is listed twice`},
		{"empty group", Options{Groups: []Group{{}}}, "name is empty"},
		{"empty key", Options{AuthKeys: []string{""}}, "auth keys[0] is empty"},
		{"negative interval", Options{WorkerInterval: -time.Second}, "worker interval"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewServer(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestGroupSetters(t *testing.T) {
	e := newEnv(t, Options{Groups: []Group{{Name: "a"}}})
	if err := e.srv.SetAgents("nope", 1); err == nil {
		t.Error("SetAgents on an unknown group succeeded")
	}
	if err := e.srv.SetApplyFailure("nope", true); err == nil {
		t.Error("SetApplyFailure on an unknown group succeeded")
	}
	if err := e.srv.SetAgents("a", -1); err == nil {
		t.Error("negative agents accepted")
	}
	mustNoErr(t, e.srv.SetAgents("a", 2))
	e.resp(e.post(reqSpec{id: "r", groups: []string{"a"}, add: []string{"10.0.0.1:80"}}.json()))
	e.steps(3)
	if r := e.mustState("r", stateSuccess, ""); len(r.Agents[typeApply]) != 2 {
		t.Errorf("APPLY answers = %d, want one per agent (2)", len(r.Agents[typeApply]))
	}
}

// An upstream is read in its object form; Baragon's bare-string forms are
// not implemented and get 400, as JSON that does not map onto a request.
func TestUpstreamForms(t *testing.T) {
	tests := []struct {
		in   string
		want upstream
	}{
		{`{"upstream":"h.example:1","group":""}`, upstream{Upstream: "h.example:1"}},
		{`{"upstream":"h.example:1","group":null,"originalPath":"x"}`, upstream{Upstream: "h.example:1", Group: "default"}},
		{`{"upstream":"h:1","requestId":"r","rackId":"k","group":"g","resolvedUpstream":"1.2.3.4:1"}`,
			upstream{Upstream: "h:1", RequestID: "r", RackID: "k", Group: "g", ResolvedUpstream: "1.2.3.4:1"}},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			var got upstream
			mustNoErr(t, json.Unmarshal([]byte(tc.in), &got))
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	e := newEnv(t, Options{})
	body := strings.Replace(reqSpec{id: "r", add: []string{"10.0.0.1:80"}}.json(),
		`{"group":"default","requestId":"r","upstream":"10.0.0.1:80"}`, `"10.0.0.1:80"`, 1)
	if got := e.post(body); got.status != http.StatusBadRequest {
		t.Errorf("bare-string upstream: %d %s, want 400", got.status, got.body)
	}
}

// A response carries nulls for absent values; the stored
// request keeps an absent action absent.
func TestResponseShape(t *testing.T) {
	e := newEnv(t, Options{})
	body := reqSpec{id: "r", add: []string{"10.0.0.1:80"}, extra: map[string]any{"action": nil}}.json()
	got := e.post(body).body
	for _, want := range []string{`"action":null`, `"templateName":null`, `"edgeCacheDNS":null`, `"replaceServiceId":null`,
		`"resolvedUpstream":null`, `"rackId":null`, `"purgeCache":false`, `"agentResponses":{}`} {
		if !strings.Contains(got, want) {
			t.Errorf("response lacks %s: %s", want, got)
		}
	}
	e.steps(3)
	e.mustState("r", stateSuccess, "UPDATE request succeeded! Added upstreams: [10.0.0.1:80], Removed upstreams: []")
}

func TestEdgeCacheDNSIsMerged(t *testing.T) {
	e := newEnv(t, Options{})
	body := reqSpec{id: "r", svcExtra: map[string]any{"edgeCacheDNS": "cdn.example.com", "edgeCacheDomains": []string{"b.example.com"}}}.json()
	if got := e.post(body).body; !strings.Contains(got, `"edgeCacheDomains":["b.example.com","cdn.example.com"]`) {
		t.Errorf("response %s", got)
	}
}

func TestConcurrentClients(t *testing.T) {
	srv, err := NewServer(Options{WorkerInterval: time.Millisecond})
	mustNoErr(t, err)
	base, err := srv.Start("127.0.0.1:0")
	mustNoErr(t, err)
	defer srv.Close()
	defer func() {
		start := time.Now()
		mustNoErr(t, srv.Close())
		if d := time.Since(start); d > time.Second {
			t.Errorf("Close took %s", d)
		}
	}()
	uri := srv.RequestURL(base)
	done := make(chan error, 16)
	for i := range 16 {
		go func() {
			id := "c" + string(rune('a'+i))
			body := reqSpec{id: id, add: []string{"10.0.0." + string(rune('1'+i%9)) + ":8" + string(rune('0'+i%10))}, extra: map[string]any{"noDuplicateUpstreams": false}}.json()
			for range 3 {
				resp, err := http.Post(uri, "application/json", strings.NewReader(body))
				if err != nil {
					done <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if r, err := http.Get(uri + "/" + id); err == nil {
					r.Body.Close()
				}
			}
			done <- nil
		}()
	}
	for range 16 {
		mustNoErr(t, <-done)
	}
	waitFor(t, "all requests final", func() bool {
		for i := range 16 {
			if s, _ := srv.RequestState("c" + string(rune('a'+i))); s != stateSuccess {
				return false
			}
		}
		return true
	})
}
