package lbhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestStates(t *testing.T) {
	tests := []struct {
		state             RequestState
		final, inProgress bool
	}{
		{StateUnknown, false, false},
		{StateFailed, true, false},
		{StateWaiting, false, true},
		{StateSuccess, true, false},
		{StateCanceling, false, true},
		{StateCanceled, true, false},
		{StateInvalidRequestNoop, true, false},
	}
	if len(tests) != len(States()) {
		t.Fatalf("States() has %d entries, test covers %d", len(States()), len(tests))
	}
	for i, tc := range tests {
		if States()[i] != tc.state {
			t.Errorf("States()[%d] = %s, want %s (Baragon's order)", i, States()[i], tc.state)
		}
		if !tc.state.Valid() || tc.state.IsFinal() != tc.final || tc.state.InProgress() != tc.inProgress {
			t.Errorf("%s: valid %v final %v inProgress %v", tc.state, tc.state.Valid(), tc.state.IsFinal(), tc.state.InProgress())
		}
	}
	if RequestState("DONE").Valid() || RequestState("").IsFinal() || RequestState("waiting").InProgress() {
		t.Error("an unknown state counts as valid, final or in progress")
	}
}

func compact(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// An ADD and a REMOVE as Singularity writes them, byte for byte
// (docs/lb-contract.md#wire-form-of-requests).
func TestRequestSerializesLikeSingularity(t *testing.T) {
	const task = "web-d1-1700000000000-1-host1.example.com-us_east_1a"
	svc := BaragonService{
		ServiceID: "web", Owners: []string{"team@example.com"}, ServiceBasePath: "/web",
		LoadBalancerGroups: []string{"prod-lb"},
	}
	up := func(id string) []UpstreamInfo {
		return []UpstreamInfo{{Upstream: "host1.example.com:31005", RequestID: id, RackID: "us_east_1a", Group: "default"}}
	}
	withOptions := svc
	withOptions.Options = map[string]any{"nginxExtraConfigs": []any{}}
	tests := []struct {
		name string
		req  BaragonRequest
		want string
	}{
		{"ADD", BaragonRequest{
			LoadBalancerRequestID: task + "-ADD-1", LoadBalancerService: withOptions,
			AddUpstreams: up(task + "-ADD-1"), Action: ActionUpdate, NoDuplicateUpstreams: true,
		}, `{"loadBalancerRequestId":"web-d1-1700000000000-1-host1.example.com-us_east_1a-ADD-1",
 "loadBalancerService":{"serviceId":"web","owners":["team@example.com"],"serviceBasePath":"/web",
   "additionalPaths":[],"loadBalancerGroups":["prod-lb"],"options":{"nginxExtraConfigs":[]},
   "domains":[],"edgeCacheDomains":[],"preResolveUpstreamDNS":false},
 "addUpstreams":[{"upstream":"host1.example.com:31005",
   "requestId":"web-d1-1700000000000-1-host1.example.com-us_east_1a-ADD-1",
   "rackId":"us_east_1a","group":"default"}],
 "removeUpstreams":[],"replaceUpstreams":[],"action":"UPDATE",
 "noValidate":false,"noReload":false,"upstreamUpdateOnly":false,"noDuplicateUpstreams":true}`},
		{"REMOVE", BaragonRequest{
			LoadBalancerRequestID: task + "-REMOVE-1", LoadBalancerService: svc,
			RemoveUpstreams: up(task + "-REMOVE-1"), Action: ActionUpdate, NoDuplicateUpstreams: true,
		}, `{"loadBalancerRequestId":"web-d1-1700000000000-1-host1.example.com-us_east_1a-REMOVE-1",
 "loadBalancerService":{"serviceId":"web","owners":["team@example.com"],"serviceBasePath":"/web",
   "additionalPaths":[],"loadBalancerGroups":["prod-lb"],"domains":[],"edgeCacheDomains":[],
   "preResolveUpstreamDNS":false},
 "addUpstreams":[],
 "removeUpstreams":[{"upstream":"host1.example.com:31005",
   "requestId":"web-d1-1700000000000-1-host1.example.com-us_east_1a-REMOVE-1",
   "rackId":"us_east_1a","group":"default"}],
 "replaceUpstreams":[],"action":"UPDATE","noValidate":false,"noReload":false,
 "upstreamUpdateOnly":false,"noDuplicateUpstreams":true}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, v := range []any{tc.req, &tc.req} {
				got, err := json.Marshal(v)
				if err != nil {
					t.Fatal(err)
				}
				if want := compact(t, tc.want); string(got) != want {
					t.Errorf("\n got %s\nwant %s", got, want)
				}
			}
		})
	}
}

func TestOptionalFields(t *testing.T) {
	tests := []struct {
		name      string
		svc       BaragonService
		has, lack []string
	}{
		{"nil options omitted", BaragonService{}, nil, []string{`"options"`, `"templateName"`, `"edgeCacheDNS"`}},
		{"empty options kept", BaragonService{Options: map[string]any{}}, []string{`"options":{}`}, nil},
		{"template when set", BaragonService{TemplateName: "tpl"}, []string{`"templateName":"tpl"`}, nil},
		{"nil lists as []", BaragonService{}, []string{`"owners":[]`, `"additionalPaths":[]`, `"loadBalancerGroups":[]`, `"domains":[]`, `"edgeCacheDomains":[]`}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.svc)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range tc.has {
				if !strings.Contains(string(b), s) {
					t.Errorf("%s lacks %s", b, s)
				}
			}
			for _, s := range tc.lack {
				if strings.Contains(string(b), s) {
					t.Errorf("%s has %s", b, s)
				}
			}
		})
	}
	b, _ := json.Marshal(BaragonRequest{})
	for _, s := range []string{`"addUpstreams":[]`, `"removeUpstreams":[]`, `"replaceUpstreams":[]`} {
		if !strings.Contains(string(b), s) {
			t.Errorf("%s lacks %s", b, s)
		}
	}
	for _, s := range []string{`replaceServiceId`, `purgeCache`, `"action"`} {
		if strings.Contains(string(b), s) {
			t.Errorf("%s has absent field %s", b, s)
		}
	}
	b, _ = json.Marshal(UpstreamInfo{Upstream: "h:1"})
	if string(b) != `{"upstream":"h:1"}` {
		t.Errorf("bare upstream = %s (an explicit empty group would not mean \"default\")", b)
	}
}

// A SUCCESS response as Baragon writes it, nulls included
// (docs/lb-contract.md#baragonresponse).
const exampleResponse = `{"loadBalancerRequestId":"web-d1-1700000000000-1-host1.example.com-us_east_1a-ADD-1",
 "loadBalancerState":"SUCCESS",
 "message":"UPDATE request succeeded! Added upstreams: [host1.example.com:31005], Removed upstreams: []",
 "agentResponses":{"APPLY":[{"url":"http://agent1:8882/baragon-agent/v2/request/web-d1-1700000000000-1-host1.example.com-us_east_1a-ADD-1",
   "attempt":0,"statusCode":200,"content":null,"exception":null}]},
 "request":{"loadBalancerRequestId":"web-d1-1700000000000-1-host1.example.com-us_east_1a-ADD-1",
   "loadBalancerService":{"serviceId":"web","owners":["team@example.com"],"serviceBasePath":"/web",
     "additionalPaths":[],"loadBalancerGroups":["prod-lb"],"options":{"nginxExtraConfigs":[]},
     "templateName":null,"domains":[],"edgeCacheDNS":null,"edgeCacheDomains":[],"preResolveUpstreamDNS":false},
   "addUpstreams":[{"upstream":"host1.example.com:31005","resolvedUpstream":null,
     "requestId":"web-d1-1700000000000-1-host1.example.com-us_east_1a-ADD-1","rackId":"us_east_1a","group":"default"}],
   "removeUpstreams":[],"replaceUpstreams":[],"replaceServiceId":null,"action":"UPDATE",
   "noValidate":false,"noReload":false,"upstreamUpdateOnly":false,"noDuplicateUpstreams":true,"purgeCache":false}}`

func TestDecodeExampleResponse(t *testing.T) {
	r, err := DecodeResponse([]byte(exampleResponse))
	if err != nil {
		t.Fatal(err)
	}
	apply := r.AgentResponses["APPLY"]
	if r.LoadBalancerState != StateSuccess || !strings.HasPrefix(r.Message, "UPDATE request succeeded!") ||
		len(apply) != 1 || apply[0].StatusCode == nil || *apply[0].StatusCode != 200 || apply[0].Content != nil ||
		r.Request == nil || r.Request.AddUpstreams[0].RackID != "us_east_1a" || r.Request.LoadBalancerService.TemplateName != "" ||
		r.Request.PurgeCache == nil || *r.Request.PurgeCache {
		t.Errorf("decoded %+v", r)
	}
}

func TestDecodeResponse(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		state   RequestState
		message string
		err     string
	}{
		{"minimal", `{"loadBalancerState":"WAITING"}`, StateWaiting, "", ""},
		{"unknown fields ignored", `{"loadBalancerState":"CANCELED","message":"m","future":{"x":[1]},"postApplyStepsSucceeded":true}`, StateCanceled, "m", ""},
		{"null message", `{"loadBalancerState":"FAILED","message":null,"agentResponses":null,"request":null}`, StateFailed, "", ""},
		{"odd agentResponses kept out", `{"loadBalancerState":"SUCCESS","message":"ok","agentResponses":[1,2]}`, StateSuccess, "ok", ""},
		{"missing state", `{"message":"m"}`, "", "", "loadBalancerState is missing"},
		{"null state", `{"loadBalancerState":null}`, "", "", "loadBalancerState is null"},
		{"unknown state", `{"loadBalancerState":"DONE"}`, "", "", `"DONE" is not a Baragon request state`},
		{"state is case sensitive", `{"loadBalancerState":"success"}`, "", "", "not a Baragon request state"},
		{"key is case sensitive", `{"LoadBalancerState":"SUCCESS"}`, "", "", "missing"},
		{"state of another type", `{"loadBalancerState":3}`, "", "", "loadBalancerState"},
		{"message of another type", `{"loadBalancerState":"SUCCESS","message":{}}`, "", "", "message"},
		{"array", `[]`, "", "", "cannot unmarshal"},
		{"null", `null`, "", "", "not a JSON object"},
		{"empty", ``, "", "", "unexpected end"},
		{"truncated", `{"loadBalancerState":"SUCCESS"`, "", "", "unexpected end"},
		{"html", `<html>502</html>`, "", "", "invalid character"},
		{"trailing garbage", `{"loadBalancerState":"SUCCESS"} x`, "", "", "invalid character"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := DecodeResponse([]byte(tc.body))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.LoadBalancerState != tc.state || r.Message != tc.message {
				t.Errorf("got %s %q", r.LoadBalancerState, r.Message)
			}
		})
	}
}

// UpstreamInfo also decodes from a bare string
// (docs/lb-contract.md#upstreaminfo).
func TestUpstreamInfoStringForms(t *testing.T) {
	tests := []struct {
		in   string
		want UpstreamInfo
		err  bool
	}{
		{`"10.0.0.1:80"`, UpstreamInfo{Upstream: "10.0.0.1:80"}, false},
		{`"aG9zdDo4MA|req|rack|grp|1.2.3.4:80"`, UpstreamInfo{Upstream: "host:80", RequestID: "req", RackID: "rack", Group: "grp", ResolvedUpstream: "1.2.3.4:80"}, false},
		{`"aG9zdDo4MA=="`, UpstreamInfo{Upstream: "host:80"}, false},
		{`"aG9zdDo4MA|r"`, UpstreamInfo{Upstream: "host:80", RequestID: "r"}, false},
		{`"localhost:80"`, UpstreamInfo{}, true},
		{`{"upstream":"h:1","group":"g","originalPath":"x"}`, UpstreamInfo{Upstream: "h:1", Group: "g"}, false},
		{`{"upstream":5}`, UpstreamInfo{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			var got UpstreamInfo
			err := json.Unmarshal([]byte(tc.in), &got)
			if (err != nil) != tc.err {
				t.Fatalf("err = %v", err)
			}
			if !tc.err && got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestUpstreamIdentity(t *testing.T) {
	a := UpstreamInfo{Upstream: "h:1", RequestID: "x"}
	if !a.SameTarget(UpstreamInfo{Upstream: "h:1", Group: "default", RequestID: "y"}) {
		t.Error("empty group is not the default group")
	}
	if a.SameTarget(UpstreamInfo{Upstream: "h:1", Group: "canary"}) || a.SameTarget(UpstreamInfo{Upstream: "h:2"}) {
		t.Error("different targets match")
	}
	if !HasUpstream([]UpstreamInfo{{Upstream: "h:2"}, {Upstream: "h:1", Group: "default"}}, a) || HasUpstream(nil, a) {
		t.Error("HasUpstream")
	}
	if a.String() != "h:1" {
		t.Errorf("String() = %s", a.String())
	}
}

func TestServiceStateDecode(t *testing.T) {
	st, err := decodeServiceState([]byte(`{"service":{"serviceId":"web","owners":[],"serviceBasePath":"/web","loadBalancerGroups":["g"],"options":null},
		"upstreams":[{"upstream":"h:1","resolvedUpstream":null,"requestId":"r","rackId":null,"group":"default"},"10.0.0.1:80"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if st.Service.ServiceID != "web" || len(st.Upstreams) != 2 || st.Upstreams[1].Upstream != "10.0.0.1:80" {
		t.Errorf("decoded %+v", st)
	}
	for _, bad := range []string{`null`, `{}`, `{"service":5}`, `x`} {
		if _, err := decodeServiceState([]byte(bad)); err == nil {
			t.Errorf("%s decoded", bad)
		}
	}
	if !errors.Is(&CallError{StatusCode: 404}, ErrNotFound) || errors.Is(&CallError{StatusCode: 500}, ErrNotFound) {
		t.Error("CallError.Is")
	}
}
