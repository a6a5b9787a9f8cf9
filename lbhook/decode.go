package lbhook

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nomad-driver-singleton/nomad-driver-singleton/internal/textclip"
)

// maxBodyBytes bounds how much of an answer the client reads. A longer body
// is treated as unreadable (UNKNOWN).
const maxBodyBytes = 1 << 20

// MaxLBText bounds what one piece of an LB's answer (its message, its
// request id, an unknown state, an excerpt of its body) may put into an
// error, a log line or a task event; a longer piece is cut and marked so.
// The LB is the job's choice, and task events are stored in Nomad's Raft
// log: an answer must not be able to fill it.
const MaxLBText = 400

// clipLB bounds one piece of the LB's text to MaxLBText (valid UTF-8).
func clipLB(s string) string { return textclip.Clip(s, MaxLBText) }

// errNotObject is returned for a body that is valid JSON but not an object.
var errNotObject = errors.New("body is not a JSON object")

// DecodeResponse parses a BaragonResponse body.
//
// Like Singularity, which reads only loadBalancerState and message, it is
// strict about those two: the state must be present and one of the seven
// Baragon states, and the message must be a string or null. Both keys are
// matched exactly (Go's decoder would otherwise also accept "LOADBALANCERSTATE").
// Unknown fields are ignored. The other fields are decoded when they have the
// documented types and left empty otherwise, so that an odd agentResponses
// entry never turns a good answer into UNKNOWN.
func DecodeResponse(data []byte) (BaragonResponse, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return BaragonResponse{}, fmt.Errorf("decode Baragon response: %w", err)
	}
	if raw == nil {
		return BaragonResponse{}, fmt.Errorf("decode Baragon response: %w", errNotObject)
	}
	state, err := decodeState(raw["loadBalancerState"])
	if err != nil {
		return BaragonResponse{}, fmt.Errorf("decode Baragon response: %w", err)
	}
	message, err := decodeOptionalString(raw["message"])
	if err != nil {
		return BaragonResponse{}, fmt.Errorf("decode Baragon response: message: %w", err)
	}
	var resp BaragonResponse
	if json.Unmarshal(data, &resp) != nil {
		// Keep only what Singularity reads; the rest had unexpected types.
		resp = BaragonResponse{}
	}
	resp.LoadBalancerState = state
	resp.Message = clipLB(message)
	id, _ := decodeOptionalString(raw["loadBalancerRequestId"])
	resp.LoadBalancerRequestID = clipLB(id)
	return resp, nil
}

func decodeState(raw json.RawMessage) (RequestState, error) {
	if raw == nil {
		return "", errors.New("loadBalancerState is missing")
	}
	var s *string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("loadBalancerState: %w", err)
	}
	if s == nil {
		return "", errors.New("loadBalancerState is null")
	}
	state := RequestState(*s)
	if !state.Valid() {
		return "", fmt.Errorf("loadBalancerState %q is not a Baragon request state", clipLB(*s))
	}
	return state, nil
}

// decodeOptionalString decodes a JSON string; absent and null give "".
func decodeOptionalString(raw json.RawMessage) (string, error) {
	if raw == nil {
		return "", nil
	}
	var s *string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", err
	}
	if s == nil {
		return "", nil
	}
	return *s, nil
}

// decodeServiceState parses the answer of GET /state/{serviceId}.
func decodeServiceState(data []byte) (BaragonServiceState, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return BaragonServiceState{}, fmt.Errorf("decode Baragon service state: %w", err)
	}
	if raw == nil {
		return BaragonServiceState{}, fmt.Errorf("decode Baragon service state: %w", errNotObject)
	}
	if _, ok := raw["service"]; !ok {
		return BaragonServiceState{}, errors.New("decode Baragon service state: service is missing")
	}
	var st BaragonServiceState
	if err := json.Unmarshal(data, &st); err != nil {
		return BaragonServiceState{}, fmt.Errorf("decode Baragon service state: %w", err)
	}
	return st, nil
}
