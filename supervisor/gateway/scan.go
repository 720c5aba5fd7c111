package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// The scanners below read every client body on the hot path (parseBody,
// prefixKey) and the engines' answers for their usage (usageOf). JSON is
// walked structurally, jumping from quote to quote, and only the members
// the gateway reads are ever decoded. Values it skips are not validated:
// checking every byte of a long prompt costs more than the rest of the
// gateway's work, and the engine, which parses the body whole, refuses
// what is not JSON with its own 400. What they promise (FuzzScanObject
// holds them to it, against encoding/json):
//
//   - on a JSON text encoding/json accepts, the same members as it reads
//     (keys decoded alike, values byte for byte, the last of a repeated
//     key winning) when it is an object, and an error when it is not;
//   - on anything else, an error, or an object whose fault lies inside a
//     member's key or value, never in the object's own structure;
//   - never a panic, and output bounded by the input; nothing allocated
//     but the keys that need decoding (escaped, or not UTF-8).

// span is a value's bytes in the body, [start, end).
type span struct{ start, end int }

func (s span) ok() bool { return s.end > s.start }

var errTruncated = errors.New("unexpected end")

// scanObject walks the members of the JSON object in b, calling visit with
// each key (decoded) and the span of its value. A key given twice is
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
		// Decoded as encoding/json decodes it: escapes, and bytes that
		// are not UTF-8 (each one U+FFFD), which it accepts in a string.
		if bytes.IndexByte(key, '\\') >= 0 || !utf8.Valid(key) {
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

// arrayElems returns the spans of a JSON array's elements; nil when raw is
// not a well-formed array.
func arrayElems(raw []byte) []span {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil
	}
	var out []span
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return nil
	}
	for i < len(raw) {
		end, err := skipValue(raw, i)
		if err != nil {
			return nil
		}
		out = append(out, span{i, end})
		i = skipSpace(raw, end)
		if i >= len(raw) {
			return nil
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case ']':
			return out
		default:
			return nil
		}
	}
	return nil
}
