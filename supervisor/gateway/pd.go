package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// Prefill/decode disaggregation: the bodies of the two protocols' legs,
// built and tested against the engines' reference proxies; pdroute.go
// routes them.
//
// Usage: the client is told the decode's, which counts the whole prompt
// (vLLM's and SGLang's decode requests carry it, and both report it in
// prompt_tokens, the transferred part as cached), so the prompt is
// counted once; the prefill leg's answer, one token, is not relayed or
// counted.
//
// vLLM's NixlConnector, as tests/v1/kv_connector/nixl_integration/
// toy_proxy_server.py drives it: leg 1 goes to a prefill engine with
// kv_transfer_params {do_remote_decode: true, do_remote_prefill: false,
// remote_*: null}, stream false, max_tokens 1 (and max_completion_tokens
// 1 when the client gave it), without stream_options, min_tokens and
// min_completion_tokens (send_request_to_service: "not supported for
// P"); leg 2 goes to a decode engine with the client's body as it came
// plus the kv_transfer_params the prefill answered, verbatim
// (_handle_completions), and its answer is the client's. Both legs carry
// one X-Request-Id. The toy proxy sends leg 2 without parameters when the
// prefill answered none, so the decode engine recomputes the prompt and
// nobody hears of it (vllm #26896): prefillParams says so instead.
//
// SGLang's bootstrap, as python/sglang/srt/disaggregation/mini_lb.py
// drives it: the same body to both engines at once, with bootstrap_host
// and bootstrap_port (the prefill engine's bootstrap server) and a
// bootstrap_room, random in [0, 2^63-1], that pairs the two.

// pdPrefillBody is leg 1 of vLLM's protocol for the client's body.
func pdPrefillBody(body []byte) ([]byte, error) {
	m, err := pdFields(body)
	if err != nil {
		return nil, err
	}
	m["kv_transfer_params"] = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)
	m["stream"] = json.RawMessage("false")
	m["max_tokens"] = json.RawMessage("1")
	if _, ok := m["max_completion_tokens"]; ok {
		m["max_completion_tokens"] = json.RawMessage("1")
	}
	delete(m, "stream_options")
	delete(m, "min_tokens")
	delete(m, "min_completion_tokens")
	return json.Marshal(m)
}

// pdDecodeBody is leg 2 of vLLM's protocol: the client's body with the
// prefill's kv_transfer_params, verbatim.
func pdDecodeBody(body []byte, params json.RawMessage) ([]byte, error) {
	m, err := pdFields(body)
	if err != nil {
		return nil, err
	}
	m["kv_transfer_params"] = params
	return json.Marshal(m)
}

// pdPrefillParams is the kv_transfer_params of a prefill engine's answer,
// and false when it has none (the request would be recomputed by decode:
// the no_params outcome) or they do not ask for a remote prefill.
func pdPrefillParams(answer []byte) (json.RawMessage, bool) {
	var a struct {
		Params json.RawMessage `json:"kv_transfer_params"`
	}
	if json.Unmarshal(answer, &a) != nil || len(a.Params) == 0 || bytes.Equal(a.Params, []byte("null")) {
		return nil, false
	}
	var p struct {
		DoRemotePrefill bool `json:"do_remote_prefill"`
	}
	if json.Unmarshal(a.Params, &p) != nil || !p.DoRemotePrefill {
		return nil, false
	}
	return a.Params, true
}

// pdBootstrapBody is SGLang's body for both engines: the client's, with
// the prefill's bootstrap address and the pair's room.
func pdBootstrapBody(body []byte, host string, port int, room uint64) ([]byte, error) {
	if room >= 1<<63 {
		return nil, fmt.Errorf("bootstrap_room %d: want below 2^63", room)
	}
	m, err := pdFields(body)
	if err != nil {
		return nil, err
	}
	h, _ := json.Marshal(host)
	m["bootstrap_host"] = h
	m["bootstrap_port"] = json.RawMessage(strconv.Itoa(port))
	m["bootstrap_room"] = json.RawMessage(strconv.FormatUint(room, 10))
	return json.Marshal(m)
}

// pdFields is a request body's top-level fields, each kept as it came.
func pdFields(body []byte) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("request body: %w", err)
	}
	if m == nil {
		return nil, fmt.Errorf("request body: want a JSON object")
	}
	return m, nil
}
