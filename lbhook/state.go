package lbhook

// RequestState is the public state of a Baragon request (BaragonRequestState).
type RequestState string

// The states of BaragonRequestState, in Baragon's declaration order.
// Baragon itself never answers UNKNOWN: clients synthesize it for transport
// errors, timeouts and unreadable answers
// (docs/lb-contract.md#states).
const (
	StateUnknown            RequestState = "UNKNOWN"
	StateFailed             RequestState = "FAILED"
	StateWaiting            RequestState = "WAITING"
	StateSuccess            RequestState = "SUCCESS"
	StateCanceling          RequestState = "CANCELING"
	StateCanceled           RequestState = "CANCELED"
	StateInvalidRequestNoop RequestState = "INVALID_REQUEST_NOOP"
)

// States lists every RequestState in Baragon's declaration order.
func States() []RequestState {
	return []RequestState{
		StateUnknown, StateFailed, StateWaiting, StateSuccess,
		StateCanceling, StateCanceled, StateInvalidRequestNoop,
	}
}

// Valid reports whether s is one of the seven Baragon states.
func (s RequestState) Valid() bool {
	switch s {
	case StateUnknown, StateFailed, StateWaiting, StateSuccess,
		StateCanceling, StateCanceled, StateInvalidRequestNoop:
		return true
	}
	return false
}

// IsFinal reports whether s can no longer change (Baragon's isRemovable):
// SUCCESS, FAILED, CANCELED or INVALID_REQUEST_NOOP.
func (s RequestState) IsFinal() bool {
	switch s {
	case StateSuccess, StateFailed, StateCanceled, StateInvalidRequestNoop:
		return true
	}
	return false
}

// InProgress reports whether Baragon is still working on the request
// (Baragon's inProgress): WAITING or CANCELING. UNKNOWN is neither final nor
// in progress: the client does not know.
func (s RequestState) InProgress() bool {
	return s == StateWaiting || s == StateCanceling
}

// String returns the wire name.
func (s RequestState) String() string { return string(s) }

// RequestAction is the action of a BaragonRequest. An absent action means
// UPDATE. Clients may not send REVERT.
type RequestAction string

// The values of Baragon's RequestAction.
const (
	ActionUpdate            RequestAction = "UPDATE"
	ActionDelete            RequestAction = "DELETE"
	ActionReload            RequestAction = "RELOAD"
	ActionRevert            RequestAction = "REVERT"
	ActionGetRenderedConfig RequestAction = "GET_RENDERED_CONFIG"
	ActionPurgeCache        RequestAction = "PURGE_CACHE"
)
