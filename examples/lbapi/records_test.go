package lbapi

import (
	"encoding/json"
	"slices"
	"testing"
)

// Request and Requests report what was stored, with Clock stamps taken when
// the request was enqueued and when it became final.
func TestRequestRecords(t *testing.T) {
	var now int64 = 100
	e := newEnv(t, Options{Clock: func() int64 { return now }})

	if _, ok := e.srv.Request("nope"); ok {
		t.Error("Request of an unknown id reported a record")
	}
	e.resp(e.post(reqSpec{id: "add-1", add: []string{"10.0.0.1:80"}, remove: []string{"10.0.0.9:80"}}.json()))
	rec, ok := e.srv.Request("add-1")
	if !ok {
		t.Fatal("no record of an enqueued request")
	}
	if rec.State != stateWaiting || rec.Done() || rec.Enqueued != 100 || rec.Finished != 0 || rec.ServiceID != "web" {
		t.Errorf("active record = %+v", rec)
	}
	if !slices.Equal(rec.AddUpstreams, []string{"10.0.0.1:80"}) || !slices.Equal(rec.RemoveUpstreams, []string{"10.0.0.9:80"}) {
		t.Errorf("upstreams add %v remove %v", rec.AddUpstreams, rec.RemoveUpstreams)
	}
	var body struct {
		ID     string `json:"loadBalancerRequestId"`
		Remove []struct {
			Upstream  string `json:"upstream"`
			RequestID string `json:"requestId"`
		} `json:"removeUpstreams"`
	}
	if err := json.Unmarshal(rec.Body, &body); err != nil || body.ID != "add-1" || len(body.Remove) != 1 || body.Remove[0].Upstream != "10.0.0.9:80" {
		t.Errorf("body %s (%v) does not hold the request", rec.Body, err)
	}

	now = 200
	e.steps(3)
	rec, _ = e.srv.Request("add-1")
	if rec.State != stateSuccess || !rec.Done() || rec.Enqueued != 100 || rec.Finished != 200 {
		t.Errorf("finished record = %+v", rec)
	}
	if !json.Valid(rec.Body) {
		t.Errorf("history body is not JSON: %s", rec.Body)
	}

	now = 300
	e.resp(e.post(reqSpec{id: "rm-1", remove: []string{"10.0.0.1:80"}}.json()))
	e.resp(e.post(reqSpec{id: "other", svc: "api", add: []string{"10.0.0.2:80"}}.json()))
	e.resp(e.post(reqSpec{id: "bad", groups: []string{"missing"}, svc: "bad", add: []string{"10.0.0.3:80"}}.json()))
	e.steps(4)
	if rec, _ := e.srv.Request("bad"); rec.State != stateInvalidRequestNoop || rec.Finished != 300 {
		t.Errorf("invalid request record = %+v", rec)
	}
	var ids []string
	for _, r := range e.srv.Requests("web") {
		ids = append(ids, r.ID)
	}
	if !slices.Equal(ids, []string{"add-1", "rm-1"}) {
		t.Errorf("Requests(web) = %v, want add-1 then rm-1", ids)
	}
	if got := e.srv.Requests("nothing"); len(got) != 0 {
		t.Errorf("Requests of an unknown service = %+v", got)
	}
}

// The default clock is Unix nanoseconds.
func TestRequestRecordDefaultClock(t *testing.T) {
	e := newEnv(t, Options{})
	e.resp(e.post(reqSpec{id: "a", add: []string{"10.0.0.1:80"}}.json()))
	e.steps(3)
	rec, _ := e.srv.Request("a")
	if rec.Enqueued <= 0 || rec.Finished < rec.Enqueued {
		t.Errorf("default clock stamps enqueued %d finished %d", rec.Enqueued, rec.Finished)
	}
}
