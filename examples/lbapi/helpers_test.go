package lbapi

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const testKey = "k3y-for-tests"

// testEnv is a manual-worker server behind httptest.
type testEnv struct {
	t   *testing.T
	srv *Server
	ts  *httptest.Server
	uri string // request collection
}

func newEnv(t *testing.T, opts Options) *testEnv {
	t.Helper()
	if opts.AuthKeys == nil {
		opts.AuthKeys = []string{testKey}
	}
	opts.ManualWorker = true
	srv, err := NewServer(opts)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &testEnv{t: t, srv: srv, ts: ts, uri: srv.RequestURL(ts.URL)}
}

// answer is an HTTP status and body.
type answer struct {
	status int
	body   string
}

func (e *testEnv) do(method, url, contentType, body string) answer {
	e.t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return answer{resp.StatusCode, string(b)}
}

func (e *testEnv) post(body string) answer {
	return e.do(http.MethodPost, e.uri+"?authkey="+testKey, "application/json", body)
}

func (e *testEnv) get(id string) answer { return e.do(http.MethodGet, e.uri+"/"+id, "", "") }

func (e *testEnv) del(id string) answer {
	return e.do(http.MethodDelete, e.uri+"/"+id+"?authkey="+testKey, "", "")
}

func (e *testEnv) state(serviceID string) answer {
	return e.do(http.MethodGet, strings.Replace(e.uri, "request", "state", 1)+"/"+serviceID, "", "")
}

// resp decodes a BaragonResponse body.
func (e *testEnv) resp(a answer) wireResponse {
	e.t.Helper()
	if a.status != http.StatusOK {
		e.t.Fatalf("status %d, body %s", a.status, a.body)
	}
	var r wireResponse
	if err := json.Unmarshal([]byte(a.body), &r); err != nil {
		e.t.Fatalf("decode %s: %v", a.body, err)
	}
	return r
}

// mustState POSTs nothing: it GETs id and checks state (and message if set).
func (e *testEnv) mustState(id, state, message string) wireResponse {
	e.t.Helper()
	r := e.resp(e.get(id))
	if r.State != state || (message != "" && r.Message != message) {
		e.t.Fatalf("%s: got %s %q, want %s %q", id, r.State, r.Message, state, message)
	}
	return r
}

// steps runs the worker n times.
func (e *testEnv) steps(n int) {
	for range n {
		e.srv.Step()
	}
}

// wireResponse is what a client reads.
type wireResponse struct {
	ID      string                     `json:"loadBalancerRequestId"`
	State   string                     `json:"loadBalancerState"`
	Message string                     `json:"message"`
	Agents  map[string][]agentResponse `json:"agentResponses"`
	Request *json.RawMessage           `json:"request"`
}

// reqSpec builds a request body.
type reqSpec struct {
	id, svc, path string
	groups        []string
	add, remove   []string // upstreams "host:port" or "host:port@group"
	replace       []string
	extra         map[string]any // top-level overrides
	svcExtra      map[string]any // service overrides
}

func (s reqSpec) json() string {
	if s.svc == "" {
		s.svc = "web"
	}
	if s.path == "" {
		s.path = "/" + s.svc
	}
	if s.groups == nil {
		s.groups = []string{"default"}
	}
	svc := map[string]any{
		"serviceId": s.svc, "owners": []string{"team@example.com"}, "serviceBasePath": s.path,
		"additionalPaths": []string{}, "loadBalancerGroups": s.groups, "domains": []string{},
		"edgeCacheDomains": []string{}, "preResolveUpstreamDNS": false,
	}
	for k, v := range s.svcExtra {
		svc[k] = v
	}
	body := map[string]any{
		"loadBalancerRequestId": s.id, "loadBalancerService": svc,
		"addUpstreams": ups(s.add, s.id), "removeUpstreams": ups(s.remove, s.id),
		"replaceUpstreams": ups(s.replace, s.id), "action": "UPDATE",
		"noValidate": false, "noReload": false, "upstreamUpdateOnly": false, "noDuplicateUpstreams": true,
	}
	for k, v := range s.extra {
		if v == nil {
			delete(body, k)
			continue
		}
		body[k] = v
	}
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(body); err != nil {
		panic(err)
	}
	return buf.String()
}

func ups(list []string, id string) []map[string]any {
	out := []map[string]any{}
	for _, u := range list {
		host, group, ok := strings.Cut(u, "@")
		if !ok {
			group = "default"
		}
		out = append(out, map[string]any{"upstream": host, "requestId": id, "group": group})
	}
	return out
}

// waitFor polls cond for up to 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
