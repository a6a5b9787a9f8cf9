package lbapi

// Public request states (BaragonRequestState).
const (
	stateFailed             = "FAILED"
	stateWaiting            = "WAITING"
	stateSuccess            = "SUCCESS"
	stateCanceling          = "CANCELING"
	stateCanceled           = "CANCELED"
	stateInvalidRequestNoop = "INVALID_REQUEST_NOOP"
)

// Agent request types (AgentRequestType).
const (
	typeApply  = "APPLY"
	typeRevert = "REVERT"
	typeCancel = "CANCEL"
)

// internalState is Baragon's InternalRequestStates
// (docs/lb-contract.md#states).
type internalState int

const (
	statePending internalState = iota
	stateInvalidNoop
	stateSendApplyRequests
	stateCheckApplyResponses
	stateCompleted
	stateFailedSendRevertRequests
	stateFailedCheckRevertResponses
	stateFailedReverted
	stateFailedRevertFailed
	stateCancelledSendRevertRequests
	stateCancelledCheckRevertResponses
	stateCancelled
	stateFailedCancelFailed
	stateCompletedPostApplyFailed
)

// internalInfo holds the columns of InternalRequestStates and InternalStatesMap.
type internalInfo struct {
	name                string
	requireAgentRequest bool
	inFlight            bool
	public              string
	requestType         string
}

var internalStates = map[internalState]internalInfo{
	statePending:                       {"PENDING", false, false, stateWaiting, typeApply},
	stateInvalidNoop:                   {"INVALID_REQUEST_NOOP", false, false, stateInvalidRequestNoop, typeApply},
	stateSendApplyRequests:             {"SEND_APPLY_REQUESTS", true, false, stateWaiting, typeApply},
	stateCheckApplyResponses:           {"CHECK_APPLY_RESPONSES", false, true, stateWaiting, typeApply},
	stateCompleted:                     {"COMPLETED", false, false, stateSuccess, typeApply},
	stateFailedSendRevertRequests:      {"FAILED_SEND_REVERT_REQUESTS", true, true, stateWaiting, typeRevert},
	stateFailedCheckRevertResponses:    {"FAILED_CHECK_REVERT_RESPONSES", false, true, stateWaiting, typeRevert},
	stateFailedReverted:                {"FAILED_REVERTED", false, false, stateFailed, typeRevert},
	stateFailedRevertFailed:            {"FAILED_REVERT_FAILED", false, false, stateFailed, typeRevert},
	stateCancelledSendRevertRequests:   {"CANCELLED_SEND_REVERT_REQUESTS", true, true, stateCanceling, typeCancel},
	stateCancelledCheckRevertResponses: {"CANCELLED_CHECK_REVERT_RESPONSES", false, true, stateCanceling, typeCancel},
	stateCancelled:                     {"CANCELLED", false, false, stateCanceled, typeCancel},
	stateFailedCancelFailed:            {"FAILED_CANCEL_FAILED", false, false, stateFailed, typeCancel},
	stateCompletedPostApplyFailed:      {"COMPLETED_POST_APPLY_FAILED", false, false, stateSuccess, typeApply},
}

// String is the Java enum name.
func (s internalState) String() string { return internalStates[s].name }

// public is the BaragonRequestState clients see.
func (s internalState) public() string { return internalStates[s].public }

// requireAgentRequest: the state is left by sending agent requests.
func (s internalState) requireAgentRequest() bool { return internalStates[s].requireAgentRequest }

// inFlight: agents are working on the request.
func (s internalState) inFlight() bool { return internalStates[s].inFlight }

// requestType is the agent request type (APPLY, REVERT, CANCEL) of the state.
func (s internalState) requestType() string { return internalStates[s].requestType }

// cancelable is InternalStatesMap.isCancelable: the public state is WAITING.
func (s internalState) cancelable() bool { return s.public() == stateWaiting }

// removable is InternalStatesMap.isRemovable: the public state is final.
func (s internalState) removable() bool {
	switch s.public() {
	case stateSuccess, stateFailed, stateCanceled, stateInvalidRequestNoop:
		return true
	}
	return false
}

// Transitions of InternalStatesMap.typeToRequestStateMap, by agent status.
var (
	waitingStateFor = map[string]internalState{
		typeApply: stateCheckApplyResponses, typeRevert: stateFailedCheckRevertResponses, typeCancel: stateCancelledCheckRevertResponses,
	}
	successStateFor = map[string]internalState{
		typeApply: stateCompleted, typeRevert: stateFailedReverted, typeCancel: stateCancelled,
	}
	failureStateFor = map[string]internalState{
		typeApply: stateFailedSendRevertRequests, typeRevert: stateFailedRevertFailed, typeCancel: stateFailedCancelFailed,
	}
)

// agentStatus is AgentRequestsStatus, reduced to what simulated agents produce.
type agentStatus int

const (
	agentsWaiting agentStatus = iota
	agentsSuccess
	agentsFailure
)
