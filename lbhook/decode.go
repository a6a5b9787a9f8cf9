package lbhook

import (
	"encoding/json"
	"errors"
	"fmt"
)

// maxBodyBytes bounds how much of an answer the client reads. A longer body
// is treated as unreadable (UNKNOWN).
const maxBodyBytes = 1 << 20

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
	resp.Message = message
	resp.LoadBalancerRequestID, _ = decodeOptionalString(raw["loadBalancerRequestId"])
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
		return "", fmt.Errorf("loadBalancerState %q is not a Baragon request state", *s)
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
