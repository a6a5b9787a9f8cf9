package lbapi

import (
	"net/http"
	"strings"
	"testing"
)

// docs/lb-contract.md#auth and #post-answers.
func TestPostStatusCodes(t *testing.T) {
	e := newEnv(t, Options{})
	valid := reqSpec{id: "r1", add: []string{"10.0.0.1:80"}}.json()
	tests := []struct {
		name        string
		query       string
		contentType string
		body        string
		status      int
		wantBody    string // exact, when set
	}{
		{"no authkey", "", "application/json", valid, 403, ""},
		{"wrong authkey", "?authkey=nope", "application/json", valid, 403, ""},
		{"not JSON content type", "?authkey=" + testKey, "text/plain", valid, 415, `{"code":415,"message":"HTTP 415 Unsupported Media Type"}`},
		{"no content type", "?authkey=" + testKey, "", valid, 415, `{"code":415,"message":"HTTP 415 Unsupported Media Type"}`},
		{"malformed JSON", "?authkey=" + testKey, "application/json", `{"loadBalancerRequestId":`, 400, `{"code":400,"message":"Unable to process JSON"}`},
		{"wrong type", "?authkey=" + testKey, "application/json", `{"addUpstreams":"x"}`, 400, `{"code":400,"message":"Unable to process JSON"}`},
		{"unknown action", "?authkey=" + testKey, "application/json",
			reqSpec{id: "r2", extra: map[string]any{"action": "FLY"}}.json(), 400, `{"code":400,"message":"Unable to process JSON"}`},
		{"null upstream element", "?authkey=" + testKey, "application/json",
			reqSpec{id: "r2", extra: map[string]any{"addUpstreams": []any{nil}}}.json(), 400, `{"code":400,"message":"Unable to process JSON"}`},
		{"empty body", "?authkey=" + testKey, "application/json", "", 422, `{"errors":["The request body may not be null"]}`},
		{"null body", "?authkey=" + testKey, "application/json", "null", 422, `{"errors":["The request body may not be null"]}`},
		{"missing everything", "?authkey=" + testKey, "application/json", `{}`, 422,
			`{"errors":["addUpstreams may not be null","loadBalancerRequestId may not be null","loadBalancerService may not be null","removeUpstreams may not be null"]}`},
		{"bad ids and groups", "?authkey=" + testKey, "application/json",
			reqSpec{id: "a b", svc: "x|y", groups: []string{}}.json(), 422,
			`{"errors":["loadBalancerRequestId cannot contain whitespace, '/', or '|'","loadBalancerService.loadBalancerGroups size must be between 1 and 2147483647","loadBalancerService.serviceId cannot contain whitespace, '/', or '|'"]}`},
		{"null service fields", "?authkey=" + testKey, "application/json",
			reqSpec{id: "r3", svcExtra: map[string]any{"serviceId": nil, "owners": nil, "serviceBasePath": nil, "loadBalancerGroups": nil}}.json(), 422,
			`{"errors":["loadBalancerService.loadBalancerGroups may not be null","loadBalancerService.owners may not be null","loadBalancerService.serviceBasePath may not be null","loadBalancerService.serviceId may not be null"]}`},
		{"vertical tab is whitespace to Java", "?authkey=" + testKey, "application/json",
			reqSpec{id: "a\vb", add: []string{"10.0.0.1:80"}}.json(), 422,
			`{"errors":["addUpstreams[0].requestId cannot contain whitespace, '/', or '|'","loadBalancerRequestId cannot contain whitespace, '/', or '|'"]}`},
		{"upstream field limits", "?authkey=" + testKey, "application/json",
			reqSpec{id: "r4", extra: map[string]any{"addUpstreams": []map[string]any{{
				"upstream": "h.example:1", "requestId": strings.Repeat("x", 251), "rackId": "rack 1", "group": "g|h"}}}}.json(), 422,
			`{"errors":["addUpstreams[0].group cannot contain whitespace, '/', or '|'","addUpstreams[0].rackId cannot contain whitespace, '/', or '|'","addUpstreams[0].requestId size must be between 0 and 250"]}`},
		{"valid", "?authkey=" + testKey, "application/json; charset=utf-8", valid, 200, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := e.do(http.MethodPost, e.uri+tc.query, tc.contentType, tc.body)
			if got.status != tc.status {
				t.Fatalf("status %d (%s), want %d", got.status, got.body, tc.status)
			}
			if tc.status == 403 && got.body != "" {
				t.Errorf("403 body %q, want empty", got.body)
			}
			if tc.wantBody != "" && got.body != tc.wantBody {
				t.Errorf("body\n got %s\nwant %s", got.body, tc.wantBody)
			}
		})
	}
	r := e.mustState("r1", stateWaiting, "Queued as QueuedRequestId{serviceId=web, requestId=r1, index=0}")
	if len(r.Agents) != 0 || r.Agents == nil {
		t.Errorf("agentResponses of a queued request = %v, want {}", r.Agents)
	}
}

// GET and /state are open (docs/lb-contract.md#auth); POST and DELETE need the
// key.
func TestAuthOnlyOnPostAndDelete(t *testing.T) {
	e := newEnv(t, Options{})
	e.resp(e.post(reqSpec{id: "r1", add: []string{"10.0.0.1:80"}}.json()))
	e.steps(3)
	stateURI := strings.Replace(e.uri, "request", "state", 1)
	tests := []struct {
		method, url string
		status      int
	}{
		{http.MethodGet, e.uri + "/r1", 200},
		{http.MethodGet, e.uri, 405},
		{http.MethodGet, e.uri + "/history/web", 404},
		{http.MethodGet, stateURI + "/web", 200},
		{http.MethodDelete, e.uri + "/r1", 403},
		{http.MethodDelete, e.uri + "/r1?authkey=wrong", 403},
		{http.MethodDelete, e.uri + "/r1?authkey=" + testKey, 200},
		{http.MethodPut, e.uri + "/r1?authkey=" + testKey, 405},
		{http.MethodGet, e.uri + "/a/b/c", 404},
		{http.MethodGet, strings.TrimSuffix(e.uri, "/baragon/v2/request") + "/other", 404},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+strings.TrimPrefix(tc.url, e.ts.URL), func(t *testing.T) {
			if got := e.do(tc.method, tc.url, "", ""); got.status != tc.status {
				t.Fatalf("status %d (%s), want %d", got.status, got.body, tc.status)
			}
		})
	}
}

func TestAuthDisabledWithoutKeys(t *testing.T) {
	e := newEnv(t, Options{AuthKeys: []string{}})
	got := e.do(http.MethodPost, e.uri, "application/json", reqSpec{id: "r1"}.json())
	if got.status != 200 {
		t.Fatalf("status %d, want 200 with auth off", got.status)
	}
}

// docs/lb-contract.md#get-answers: unknown → 404 with an empty body; same for
// /state.
func TestUnknownIsEmpty404(t *testing.T) {
	e := newEnv(t, Options{})
	for name, got := range map[string]answer{"request": e.get("nope"), "state": e.state("nope")} {
		if got.status != 404 || got.body != "" {
			t.Errorf("%s: %d %q, want 404 and an empty body", name, got.status, got.body)
		}
	}
}
