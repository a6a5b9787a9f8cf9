package lbhook

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// An LB answer can be up to 1 MiB (maxBodyBytes), and the LB is the job's
// choice. What it puts into an error, and so into a task event (stored in
// Nomad's Raft log) and the driver's status file, is bounded: each piece of
// its text at most MaxLBText, cut at a rune and marked as cut, while the
// start that names the failure is kept for Diagnose.
func TestLBAnswerContributesBoundedText(t *testing.T) {
	huge := strings.Repeat("é", (maxBodyBytes-400)/2) // 2 bytes per rune
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   string // kept from the LB's text
		fix    string // Diagnose still recognises it
	}{
		{"FAILED with a 1 MiB message", 200,
			`{"loadBalancerRequestId":"r1","loadBalancerState":"FAILED","message":"Apply failed {` + huge + `}"}`,
			"Apply failed {éé", "could not apply the change"},
		{"a 1 MiB request id", 200,
			`{"loadBalancerRequestId":"` + huge + `","loadBalancerState":"INVALID_REQUEST_NOOP","message":"Invalid request due to non-existent load balancer groups: [x]"}`,
			"non-existent load balancer groups", "check load_balancer.groups"},
		{"a 1 MiB state", 200,
			`{"loadBalancerRequestId":"r1","loadBalancerState":"` + huge + `"}`,
			"loadBalancerState \"éé", "not a Baragon response"},
		{"a 422 with a 1 MiB body", 422, `{"errors":["` + huge + `"]}`,
			`{"errors":["éé`, "the LB rejected the request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := httptest.NewServer(newFront(nil).on(http.MethodPost, 0, answerStatus(tc.status, tc.body)))
			defer ts.Close()
			cfg := testConfig(ts.URL + "/baragon/v2/request")
			c := newTestClient(t, cfg, nil)
			resp, err := c.Post(context.Background(), c.NewRequest("r1", nil, nil))
			if err == nil {
				err = outcome(resp, time.Minute)
			}
			if err == nil {
				t.Fatalf("no error for %s", resp.LoadBalancerState)
			}
			for what, s := range map[string]string{"message": resp.Message, "request id": resp.LoadBalancerRequestID} {
				if len(s) > maxText(cfg) {
					t.Errorf("%s: %d bytes", what, len(s))
				}
			}
			d := Diagnose(err, cfg)
			got := d.String()
			if len(got) > maxText(cfg) {
				t.Errorf("diagnosis is %d bytes, want it bounded", len(got))
			}
			if !utf8.ValidString(got) {
				t.Errorf("diagnosis is not valid UTF-8")
			}
			if !strings.Contains(got, "…(cut from ") {
				t.Errorf("diagnosis does not say the LB's text was cut: %.300q", got)
			}
			if !strings.Contains(got, tc.want) || !strings.Contains(d.Fix, tc.fix) {
				t.Errorf("diagnosis %.600q: want %q kept and a fix about %q", got, tc.want, tc.fix)
			}
		})
	}
}

// An OutcomeError built by hand (a caller's, or an old one) is bounded too.
func TestOutcomeErrorBoundsItsText(t *testing.T) {
	oe := &OutcomeError{RequestID: strings.Repeat("i", 1<<20), State: StateFailed, Message: strings.Repeat("m", 1<<20)}
	if n := len(oe.Error()); n > 2*MaxLBText+100 {
		t.Errorf("%d bytes", n)
	}
	if !errors.As(error(oe), &oe) || len(oe.Message) != 1<<20 {
		t.Error("the error's own fields must stay as given")
	}
}

// maxText bounds a message about one call: two pieces of the LB's text
// (message and request id, or body excerpt and decode error) and our own
// words (method, the redacted URL twice, status, the fix).
func maxText(cfg Config) int { return 2*MaxLBText + 2*len(cfg.URI) + 400 }

// A transport error is the LB's too: a TLS error lists every name of its
// certificate.
func TestTransportErrorIsBounded(t *testing.T) {
	ce := &CallError{Method: http.MethodPost, URL: "https://lb.example/baragon/v2/request", State: StateUnknown,
		Err: errors.New("x509: certificate is valid for " + strings.Repeat("n.example, ", 1<<16) + "not lb.example")}
	for what, s := range map[string]string{"error": ce.Error(), "diagnosis": Diagnose(ce, Config{URI: ce.URL}).String()} {
		if len(s) > MaxLBText+300 {
			t.Errorf("%s is %d bytes", what, len(s))
		}
	}
}
