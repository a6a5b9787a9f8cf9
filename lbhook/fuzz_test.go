package lbhook

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzDecodeResponse checks that DecodeResponse never panics, that what it
// accepts has a valid state, and that encoding is a fixed point after one
// round trip (decode → encode → decode → encode gives the same bytes).
// The seed corpus is in testdata/fuzz/FuzzDecodeResponse.
func FuzzDecodeResponse(f *testing.F) {
	f.Add([]byte(exampleResponse))
	f.Add([]byte(`{"loadBalancerRequestId":"r","loadBalancerState":"FAILED","message":"Request r is already enqueued with different parameters","agentResponses":null,"request":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeResponse(data)
		if err != nil {
			return
		}
		if !r.LoadBalancerState.Valid() {
			t.Fatalf("accepted invalid state %q", r.LoadBalancerState)
		}
		first, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("encode %+v: %v", r, err)
		}
		r2, err := DecodeResponse(first)
		if err != nil {
			t.Fatalf("own encoding %s does not decode: %v", first, err)
		}
		if r2.LoadBalancerState != r.LoadBalancerState || r2.Message != r.Message {
			t.Fatalf("state or message changed: %q %q → %q %q", r.LoadBalancerState, r.Message, r2.LoadBalancerState, r2.Message)
		}
		second, err := json.Marshal(r2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, second) {
			t.Fatalf("not a fixed point:\n%s\n%s", first, second)
		}
	})
}
