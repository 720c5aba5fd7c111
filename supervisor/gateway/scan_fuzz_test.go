package gateway

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// scanSeeds are bodies as clients and engines send them, and the ways a
// hand-written scanner goes wrong: escapes, unicode, huge numbers,
// repeated keys, nesting, truncation, trailing bytes, not an object.
var scanSeeds = []string{
	// Requests.
	`{"model":"chat","messages":[{"role":"user","content":"hello there"}]}`,
	`{"model":"org/model-7b","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi"}],"max_tokens":64,"temperature":0.2}`,
	`{"model":"chat","prompt":"Once upon a time","max_tokens":16,"stream":false,"logprobs":null}`,
	`{"model":"chat","prompt":["a","b"],"echo":true}`,
	`{"model":"chat","prompt":[1,2,3,50256]}`,
	`{"model":"embed","input":"the quick brown fox","encoding_format":"float"}`,
	`{"model":"embed","input":["one","two"],"dimensions":256}`,
	`{"model":"chat","messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}]}`,
	`{"model":"chat","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":[1,{\"y\":\"}\"}]}"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}]}`,
	`{"model":"chat","response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object","properties":{"a":{"type":"array","items":{"type":"string"}}}}}},"messages":[{"role":"user","content":"x"}]}`,
	"\n\t{ \"model\" : \"chat\" ,\r\n \"messages\" : [ { \"role\" : \"user\" , \"content\" : \"spaced\" } ] }\n",
	"{\"model\":\"chat\",\"n\":1\r,\"stream\":true\t,\"logprobs\":null\n,\"temperature\":-2.5e-3 ,\"prompt\":[0\r]\r}",
	// Escapes and unicode.
	`{"model":"chat","messages":[{"role":"user","content":"quote \" backslash \\ slash \/ tab \t nl \n \u00e9 \ud83d\ude00"}]}`,
	`{"mod\u0065l":"chat","messages":[{"role":"user","content":"escaped key"}]}`,
	`{"model":"\u0063hat","messages":[{"role":"user","content":"escaped model"}]}`,
	`{"model":"日本語モデル","messages":[{"role":"user","content":"こんにちは 🌍 — ünïcödé"}]}`,
	`{"model":"chat","messages":[{"role":"user","content":"ends in backslashes \\\\"}],"x":"\\"}`,
	`{"model":"chat","messages":[{"role":"user","content":"lone surrogate \ud800 and \udc00"}]}`,
	"{\"model\":\"chat\",\"\xff\xfe\":1,\"messages\":[{\"role\":\"user\",\"content\":\"bad utf-8 \xc3\x28\"}]}",
	// Numbers.
	`{"model":"chat","max_tokens":1e999999,"seed":123456789012345678901234567890,"temperature":-0.0,"top_p":1E-7,"messages":[{"role":"user","content":"n"}]}`,
	// Repeated keys: the last wins, as in encoding/json and the engines.
	`{"model":"first","model":"second","messages":[{"role":"user","content":"dup"}]}`,
	`{"model":"chat","stream":true,"stream":false,"messages":[],"messages":[{"role":"user","content":"x"}]}`,
	// Nesting.
	`{"model":"chat","a":[[[[[[[[[[{"b":[{"c":{}}]}]]]]]]]]]],"messages":[{"role":"user","content":"deep"}]}`,
	`{"model":"chat","a":"[{\"not\":\"nested\"}]","messages":[{"role":"user","content":"]}"}]}`,
	`{"model":"chat","a":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `}`,
	// Answers the gateway reads usage from.
	`{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`,
	`{"id":"c","choices":[],"usage":{"prompt_tokens":1e3,"completion_tokens":-1}}`,
	`{"usage":null}`,
	// Edge shapes.
	`{}`, `{ }`, `{"":""}`, `{"a":{}}`, `{"a":[]}`, `{"a":true,"b":false,"c":null}`,
	`[]`, `null`, `"model"`, `42`, ``, ` `, `{`, `}`, `{"model"`, `{"model":`, `{"model":"chat"`, `{"model":"chat",}`,
	`{"model":"chat"} trailing`, `{"model":"chat"}{}`, `{"model" "chat"}`, `{model:"chat"}`, `{'model':'chat'}`,
	`{"model":"unterminated}`, `{"model":"chat","messages":[}`, `{"a":[1,,2]}`, `{"a":tru}`, `{"a":1"b":2}`,
	"\xef\xbb\xbf{\"model\":\"bom\"}", "{\"model\":\"ctl\x01\"}", "{\"k\x00\":1}",
}

// FuzzScanObject holds the body scanners to encoding/json. For any input:
//
//   - on a JSON text that encoding/json accepts, scanObject accepts it when
//     it is an object, with the same members (keys decoded alike, values
//     byte for byte, the last of a repeated key winning), and refuses it
//     otherwise; parseBody gives the answer a parser built on encoding/json
//     gives, for every endpoint; arrayElems finds a list's elements and
//     usageOf the usage as encoding/json reads them;
//   - on anything else, scanObject refuses, or accepts an object whose
//     fault lies inside a member's key or value (the values it skips are
//     not validated, by design; the engine refuses the body): blanking
//     each value it found gives a JSON object with as many members;
//   - it never panics, and what it returns is bounded by the input: spans
//     inside it, in order and apart, keys no more than the input's bytes
//     can decode to.
func FuzzScanObject(f *testing.F) {
	for _, s := range scanSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkScan(t, b)
	})
}

type member struct {
	key string
	v   span
}

func checkScan(t *testing.T, b []byte) {
	t.Helper()
	var got []member
	err := scanObject(b, func(key []byte, v span) { got = append(got, member{string(key), v}) })
	if err != nil {
		got = nil
	}
	checkBounded(t, b, got)

	var ref map[string]json.RawMessage
	jerr := json.Unmarshal(b, &ref)
	isObject := jerr == nil && ref != nil // "null" unmarshals to a nil map
	switch {
	case jerr == nil && !isObject:
		if err == nil {
			t.Fatalf("%q: not an object, but scanned as one: %v", b, got)
		}
	case isObject:
		if err != nil {
			t.Fatalf("%q: encoding/json reads an object, the scanner refuses it: %v", b, err)
		}
		last := map[string]string{}
		for _, m := range got {
			last[m.key] = string(b[m.v.start:m.v.end])
		}
		if len(last) != len(ref) {
			t.Fatalf("%q: scanned keys %q, encoding/json's %q", b, slices.Sorted(maps.Keys(last)), slices.Sorted(maps.Keys(ref)))
		}
		for k, v := range ref {
			if sv, ok := last[k]; !ok || sv != string(v) {
				t.Fatalf("%q: key %q: scanned %q (found %v), encoding/json %q", b, k, sv, ok, v)
			}
			checkArray(t, v)
		}
		for _, ep := range []endpoint{chatEndpoint, completionsEndpoint, embeddingsEndpoint} {
			checkParse(t, b, ep)
		}
		checkUsage(t, b, ref)
	case err == nil:
		// Invalid JSON, accepted: the fault must lie inside a key or a
		// value. Blank each value; what control bytes remain are inside
		// keys (anywhere else the scanner refuses), so blank those too.
		var blanked []byte
		at := 0
		for _, m := range got {
			blanked = append(append(blanked, b[at:m.v.start]...), "null"...)
			at = m.v.end
		}
		blanked = append(blanked, b[at:]...)
		for i, c := range blanked {
			if c < 0x20 {
				blanked[i] = ' '
			}
		}
		if n, ok := members(blanked); !ok || n != len(got) {
			t.Fatalf("%q: invalid JSON accepted with %d members, and the fault is in its structure: blanked %q reads as %d members (valid %v)",
				b, len(got), blanked, n, ok)
		}
	}
}

// checkBounded: what the scanner returns lies within the input, in order,
// and decodes no more than the input holds.
func checkBounded(t *testing.T, b []byte, got []member) {
	t.Helper()
	at, keyBytes := 0, 0
	for _, m := range got {
		if m.v.start < at || m.v.end <= m.v.start || m.v.end > len(b) {
			t.Fatalf("%q: span %v out of order or bounds (after %d)", b, m.v, at)
		}
		at = m.v.end
		keyBytes += len(m.key)
	}
	// A member takes at least 4 bytes ("":0) and a byte to part it from
	// the next; a decoded key at most 3 bytes per input byte (U+FFFD for
	// a bad one).
	if len(got) > (len(b)+1)/5+1 || keyBytes > 3*len(b) {
		t.Fatalf("%q: %d members, %d key bytes, from %d bytes of input", b, len(got), keyBytes, len(b))
	}
}

// members counts the members of a JSON object as encoding/json reads it
// (repeats included); ok is false when b is not one.
func members(b []byte) (n int, ok bool) {
	if !json.Valid(b) {
		return 0, false
	}
	d := json.NewDecoder(bytes.NewReader(b))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return 0, false
	}
	for d.More() {
		if _, err := d.Token(); err != nil {
			return 0, false
		}
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return 0, false
		}
		n++
	}
	_, err := d.Token()
	return n, err == nil
}

// checkArray compares arrayElems with encoding/json's elements of a list.
func checkArray(t *testing.T, raw json.RawMessage) {
	t.Helper()
	var ref []json.RawMessage
	if json.Unmarshal(raw, &ref) != nil || raw[0] != '[' {
		return
	}
	got := arrayElems(raw)
	if len(got) != len(ref) {
		t.Fatalf("list %q: %d elements scanned, encoding/json %d", raw, len(got), len(ref))
	}
	for i, e := range got {
		if string(raw[e.start:e.end]) != string(ref[i]) {
			t.Fatalf("list %q: element %d scanned %q, encoding/json %q", raw, i, raw[e.start:e.end], ref[i])
		}
	}
}

// checkParse compares parseBody with the same rules over encoding/json.
func checkParse(t *testing.T, b []byte, ep endpoint) {
	t.Helper()
	p, err := parseBody(b, ep)
	want, wantParam, wantOK := refParse(b, ep)
	switch {
	case wantOK != (err == nil):
		t.Fatalf("%q (%v): parseBody says %v, encoding/json's reading says ok=%v (param %q)", b, ep, err, wantOK, wantParam)
	case !wantOK && err.param != wantParam:
		t.Fatalf("%q (%v): parseBody refuses %q, encoding/json's reading %q", b, ep, err.param, wantParam)
	case wantOK && (p.model != want.model || p.stream != want.stream || string(b[p.modelSpan.start:p.modelSpan.end]) != want.rawModel):
		t.Fatalf("%q (%v): parseBody %+v, encoding/json's reading %+v", b, ep, p, want)
	}
}

type refParsed struct {
	model, rawModel string
	stream          bool
}

// refParse is parseBody's rules read with encoding/json: the param a
// refusal names, or the model and stream.
func refParse(b []byte, ep endpoint) (p refParsed, param string, ok bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil || m == nil {
		return p, "", false
	}
	raw, has := m["model"]
	if !has {
		return p, "model", false
	}
	if json.Unmarshal(raw, &p.model) != nil || p.model == "" {
		return p, "model", false
	}
	p.rawModel = string(raw)
	if s, has := m["stream"]; has {
		switch string(s) {
		case "true":
			p.stream = true
		case "false", "null":
		default:
			return p, "stream", false
		}
	}
	want := ep.required()
	r, has := m[want]
	if !has || string(r) == "null" {
		return p, want, false
	}
	if ep == chatEndpoint {
		var msgs []json.RawMessage
		if r[0] != '[' || json.Unmarshal(r, &msgs) != nil || len(msgs) == 0 {
			return p, want, false
		}
	}
	return p, "", true
}

// checkUsage compares usageOf with encoding/json's reading of a top-level
// usage, for answers that write the key plainly, as engines do (usageOf
// looks for the plain key before scanning).
func checkUsage(t *testing.T, b []byte, ref map[string]json.RawMessage) {
	t.Helper()
	if !bytes.Contains(b, usageKey) {
		return
	}
	var want usage
	raw, has := ref["usage"]
	wantOK := has && raw[0] == '{' && json.Unmarshal(raw, &want) == nil
	got, ok := usageOf(b)
	if ok != wantOK || got != want {
		t.Fatalf("%q: usageOf %+v %v, encoding/json %+v %v", b, got, ok, want, wantOK)
	}
}

// The scanner allocates nothing for a body without escaped keys, however
// long: it reads every request.
func TestScanObjectAllocatesNothing(t *testing.T) {
	body := []byte(`{"model":"chat","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat(`long \"prompt\" `, 1<<12) + `"}],"max_tokens":64}`)
	n := 0
	visit := func(key []byte, v span) { n++ }
	if allocs := testing.AllocsPerRun(20, func() {
		if err := scanObject(body, visit); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Fatalf("scanObject allocated %v times for a plain body", allocs)
	}
	// arrayElems allocates for its elements, not their bytes.
	list := []byte(`[` + strconv.Quote(strings.Repeat("x", 1<<16)) + `]`)
	if allocs := testing.AllocsPerRun(20, func() { arrayElems(list) }); allocs > 1 {
		t.Fatalf("arrayElems allocated %v times for a list of one", allocs)
	}
}
