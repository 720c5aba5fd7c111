package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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

// span is a value's bytes in the body, [start, end).
type span struct{ start, end int }

func (s span) ok() bool { return s.end > s.start }

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

var errTruncated = errors.New("unexpected end")

// scanObject walks the members of the JSON object in b, calling visit with
// each key (unescaped) and the span of its value. A key given twice is
// visited twice, so the last one wins, as in encoding/json and in the
// engines' own parsers.
func scanObject(b []byte, visit func(key []byte, v span)) error {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return fmt.Errorf("want '{' at byte %d", i)
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return trailing(b, i+1)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return fmt.Errorf("want a key at byte %d", i)
		}
		end, err := skipString(b, i)
		if err != nil {
			return err
		}
		key := b[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			var s string
			if err := json.Unmarshal(b[i:end], &s); err != nil {
				return fmt.Errorf("bad key at byte %d: %w", i, err)
			}
			key = []byte(s)
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return fmt.Errorf("want ':' at byte %d", i)
		}
		i = skipSpace(b, i+1)
		vend, err := skipValue(b, i)
		if err != nil {
			return err
		}
		visit(key, span{i, vend})
		i = skipSpace(b, vend)
		if i >= len(b) {
			return errTruncated
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return trailing(b, i+1)
		default:
			return fmt.Errorf("want ',' or '}' at byte %d", i)
		}
	}
}

func trailing(b []byte, i int) error {
	if i = skipSpace(b, i); i < len(b) {
		return fmt.Errorf("data after the object at byte %d", i)
	}
	return nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string starting at b[i]
// (a '"'). It jumps from quote to quote rather than stepping through every
// byte: prompts are long strings.
func skipString(b []byte, i int) (int, error) {
	j := i + 1
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, errTruncated
		}
		q := j + k
		// The quote is escaped when an odd number of backslashes precede it.
		n := 0
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, nil
		}
		j = q + 1
	}
}

// skipValue returns the index just past the value starting at b[i].
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errTruncated
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); {
			switch b[j] {
			case '"':
				end, err := skipString(b, j)
				if err != nil {
					return 0, err
				}
				j = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
			j++
		}
		return 0, errTruncated
	default:
		j := i
	scalar:
		for ; j < len(b); j++ {
			switch b[j] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				break scalar
			}
		}
		if j == i {
			return 0, fmt.Errorf("want a value at byte %d", i)
		}
		return j, nil
	}
}
