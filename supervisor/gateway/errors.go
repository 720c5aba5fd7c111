package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// apiError is an answer in OpenAI's error shape,
// {"error":{"message","type","param","code"}}, which OpenAI clients parse
// into their own exceptions; a plain-text error would reach the user as a
// decoding failure instead.
type apiError struct {
	status  int
	message string
	typ     string
	code    string
	param   string
	// retryAfter, when positive, is sent as Retry-After (whole seconds).
	retryAfter time.Duration
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.status, e.code, e.message) }

// The error types OpenAI uses.
const (
	typeInvalid = "invalid_request_error"
	typeAuth    = "authentication_error"
	typeServer  = "server_error"
	typeRate    = "rate_limit_error"
	// typeTimeout is not one of OpenAI's types (its clients go by the
	// status), but says what happened better than server_error.
	typeTimeout = "timeout"
)

// retryAfterNoRoute is what a client waits before retrying a deployment with
// no routable replica: an engine that is loading or being re-placed takes
// seconds at least.
const retryAfterNoRoute = 5 * time.Second

func errBadRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, message: fmt.Sprintf(format, args...), typ: typeInvalid, code: "invalid_value", param: param}
}

func errUnknownModel(model string, names []string) *apiError {
	served := "none"
	if len(names) > 0 {
		served = strings.Join(names, ", ")
	}
	return &apiError{status: http.StatusNotFound, typ: typeInvalid, code: "model_not_found", param: "model",
		message: fmt.Sprintf("the model %q does not exist; served models: %s", model, served)}
}

func errAmbiguousModel(model string, deps []string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: typeInvalid, code: "model_ambiguous", param: "model",
		message: fmt.Sprintf("the model id %q is served by several deployments (%s); name one of them", model, strings.Join(deps, ", "))}
}

func errNoRoute(name, why string) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: typeServer, code: "no_routable_replica", retryAfter: retryAfterNoRoute,
		message: fmt.Sprintf("deployment %q has no routable replica: %s", name, why)}
}

func errUnauthorized(msg string) *apiError {
	return &apiError{status: http.StatusUnauthorized, typ: typeAuth, code: "invalid_api_key", message: msg}
}

// codeStopping is the error code of an answer from a stopping node.
const codeStopping = "node_stopping"

// errStopping is /health's answer once the node stops, and a held
// request's (see exchange.route): the node will not settle now.
func errStopping() *apiError {
	return errStoppingCut("node stopping: send the request to another node")
}

// errStoppingCut answers a request cut at the drain's bound.
func errStoppingCut(msg string) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: typeServer, code: codeStopping, retryAfter: time.Second, message: msg}
}

// errSettling is the answer while the node has not heard the cluster: /health's,
// and a held request's once the hold's bound passed. The request may well
// be served by another node, or by this one in a moment.
func errSettling() *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: typeServer, code: "node_settling", retryAfter: time.Second,
		message: "node settling: it has not heard the cluster yet, so it cannot tell whether the model exists; send the request to another node or retry"}
}

func errOverloaded(limit int) *apiError {
	return &apiError{status: http.StatusTooManyRequests, typ: typeRate, code: "gateway_overloaded", retryAfter: time.Second,
		message: fmt.Sprintf("this node's gateway is at its limit of %d requests in flight", limit)}
}

func errBodyTooLarge(limit int64) *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalid, code: "request_too_large",
		message: fmt.Sprintf("request body larger than %d bytes", limit)}
}

func errNotFound(path string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: typeInvalid, code: "unknown_url",
		message: fmt.Sprintf("no such endpoint: %s", path)}
}

func errMethod(method, allow string) *apiError {
	return &apiError{status: http.StatusMethodNotAllowed, typ: typeInvalid, code: "method_not_allowed",
		message: fmt.Sprintf("method %s not allowed; use %s", method, allow)}
}

// errUpstream is the answer when no replica could be reached or every one
// tried refused the gateway; the client may retry.
func errUpstream(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadGateway, typ: typeServer, code: "upstream_unavailable", retryAfter: time.Second,
		message: fmt.Sprintf(format, args...)}
}

// errFirstByteTimeout is the answer when the engine sent no byte within
// the first-byte bound. There is no Retry-After: the same request would
// likely take as long again.
func errFirstByteTimeout(msg string) *apiError {
	return &apiError{status: http.StatusGatewayTimeout, typ: typeTimeout, code: reasonFirstByte, message: msg}
}

// codeLeftRouting is the error code of a request whose replica left
// routing unready while it waited.
const codeLeftRouting = "replica_left_routing"

// errLeftRouting is the answer when the replica a request waited on left
// routing unready and no other could take it.
func errLeftRouting(msg string) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: typeServer, code: codeLeftRouting, retryAfter: time.Second,
		message: msg}
}

// body is the JSON of the error.
func (e *apiError) body() []byte {
	type inner struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	}
	in := inner{Message: e.message, Type: e.typ, Code: e.code}
	if e.param != "" {
		in.Param = &e.param
	}
	b, _ := json.Marshal(struct {
		Error inner `json:"error"`
	}{in})
	return b
}

func (e *apiError) write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((e.retryAfter+time.Second-1)/time.Second)))
	}
	w.WriteHeader(e.status)
	b := e.body()
	_, _ = w.Write(append(b, '\n'))
}

// sseError is the final event of a stream that ended early (the engine
// broke it off, went quiet past a bound, or left routing): a client
// reading events sees an error rather than an answer that merely stops.
func sseError(code, msg string) []byte {
	e := &apiError{typ: typeServer, code: code, message: msg}
	return append(append([]byte("data: "), e.body()...), '\n', '\n')
}
