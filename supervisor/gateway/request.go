package gateway

import (
	"bytes"
	"encoding/json"
)

// endpoint is one of the proxied OpenAI endpoints.
type endpoint int

const (
	chatEndpoint endpoint = iota
	completionsEndpoint
	embeddingsEndpoint
)

func (e endpoint) String() string {
	switch e {
	case chatEndpoint:
		return "chat"
	case completionsEndpoint:
		return "completions"
	default:
		return "embeddings"
	}
}

// required is the field each endpoint cannot do without.
func (e endpoint) required() string {
	switch e {
	case chatEndpoint:
		return "messages"
	case completionsEndpoint:
		return "prompt"
	default:
		return "input"
	}
}

// parsed is what the gateway reads of a request body: no more than routing
// needs, so that everything else reaches the engine as the client sent it.
type parsed struct {
	model     string
	modelSpan span
	stream    bool
}

// parseBody reads the top level of a JSON request body: the model, whether
// it streams, and that the endpoint's required field is there. The scan is
// structural only: values the gateway does not read are skipped, not
// validated, since checking every byte of a long prompt costs more than the
// rest of the gateway's work and the engine validates them anyway (its 400
// passes through).
func parseBody(body []byte, ep endpoint) (parsed, *apiError) {
	var p parsed
	var stream, required span
	want := ep.required()
	err := scanObject(body, func(key []byte, v span) {
		switch string(key) {
		case "model":
			p.modelSpan = v
		case "stream":
			stream = v
		case want:
			required = v
		}
	})
	if err != nil {
		return p, errBadRequest("", "the body is not a JSON object: %v", err)
	}
	if !p.modelSpan.ok() {
		return p, errBadRequest("model", "model: required")
	}
	if err := json.Unmarshal(body[p.modelSpan.start:p.modelSpan.end], &p.model); err != nil || p.model == "" {
		return p, errBadRequest("model", "model: want a non-empty string, got %s", describe(body[p.modelSpan.start:p.modelSpan.end]))
	}
	if stream.ok() {
		switch raw := body[stream.start:stream.end]; string(raw) {
		case "true":
			p.stream = true
		case "false", "null":
		default:
			return p, errBadRequest("stream", "stream: want a boolean, got %s", describe(raw))
		}
	}
	if !required.ok() || string(body[required.start:required.end]) == "null" {
		return p, errBadRequest(want, "%s: required", want)
	}
	if ep == chatEndpoint {
		raw := body[required.start:required.end]
		if raw[0] != '[' {
			return p, errBadRequest(want, "messages: want a list of messages, got %s", describe(raw))
		}
		if len(bytes.TrimSpace(raw[1:len(raw)-1])) == 0 {
			return p, errBadRequest(want, "messages: at least one message is required")
		}
	}
	return p, nil
}

// describe names a JSON value's kind for an error message.
func describe(raw []byte) string {
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "a list"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// withModel returns body with its model value replaced by name, every other
// byte unchanged.
func withModel(body []byte, at span, name string) []byte {
	q, _ := json.Marshal(name)
	out := make([]byte, 0, len(body)-(at.end-at.start)+len(q))
	out = append(out, body[:at.start]...)
	out = append(out, q...)
	return append(out, body[at.end:]...)
}
