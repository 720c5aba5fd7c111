package placement

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// ErrInvalidDeployment is wrapped by every error DecodeDeployment returns,
// so an API layer can map it to a client error with errors.Is. The wrapped
// error is a *FieldError or *UnknownFieldError where one field is to blame.
var ErrInvalidDeployment = errors.New("invalid deployment")

// UnknownFieldError is a spec field that Deployment does not have.
type UnknownFieldError struct {
	Field string
	Valid []string
}

func (e *UnknownFieldError) Error() string {
	return fmt.Sprintf("unknown field %q; valid fields are %s", e.Field, strings.Join(e.Valid, ", "))
}

// Bounds on a spec's shape, checked before anything is built from it, so
// that what a hostile body costs stays a small multiple of its size.
const (
	// MaxSpecDepth bounds how deeply a spec may nest. A deployment nests
	// two levels (the object; labels, env and args in it), so 32 refuses
	// nothing a spec can mean. Without it, the work done per open level
	// made 600 KB of nested objects cost 10 GB.
	MaxSpecDepth = 32
	// MaxSpecValues bounds how many keys, values and list entries a spec
	// holds. A deployment has at most 256 args and a handful of labels and
	// env vars. The decoders spend up to several hundred bytes on each
	// value, so without it a body of tiny list entries cost 50 to 250
	// times its size (600 KB of YAML "a," took 150 MB).
	MaxSpecValues = 4096
)

// NestingError is a spec nested deeper than MaxSpecDepth.
type NestingError struct {
	Limit int
	// At says where the limit was passed: "byte 812", "line 3".
	At string
}

func (e *NestingError) Error() string {
	return fmt.Sprintf("nested deeper than %d levels (at %s); a deployment is one object whose labels and env are objects of strings and whose args is a list of strings: flatten it", e.Limit, e.At)
}

// TooManyValuesError is a spec holding more than MaxSpecValues values.
type TooManyValuesError struct {
	Limit int
	At    string
}

func (e *TooManyValuesError) Error() string {
	return fmt.Sprintf("more than %d keys, values and list entries (at %s); a deployment holds at most 256 args and a few labels and env vars: send only those", e.Limit, e.At)
}

// checkJSONShape refuses data that nests deeper than MaxSpecDepth or holds
// more than MaxSpecValues values. It reads the bytes once, allocates
// nothing and builds nothing per level, so it can run before any decoder
// sees the body; malformed JSON is left to the decoder that follows.
func checkJSONShape(data []byte) error {
	depth, values, inString, escaped := 0, 0, false, false
	for i, c := range data {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		case c == '"':
			inString = true
			continue
		case c == '{' || c == '[':
			if depth++; depth > MaxSpecDepth {
				return &NestingError{Limit: MaxSpecDepth, At: fmt.Sprintf("byte %d", i)}
			}
		case c == '}' || c == ']':
			depth--
			continue
		case c != ',' && c != ':':
			continue
		}
		// Every value but a container's first follows a comma or a
		// colon, and the first follows the bracket: a count of the three
		// is a count of keys, values and list entries.
		if values++; values > MaxSpecValues {
			return &TooManyValuesError{Limit: MaxSpecValues, At: fmt.Sprintf("byte %d", i)}
		}
	}
	return nil
}

// DuplicateFieldError is a field given twice in one object.
type DuplicateFieldError struct{ Field string }

func (e *DuplicateFieldError) Error() string {
	return fmt.Sprintf("%s: given more than once; give each field once", e.Field)
}

// deploymentField is one JSON field of Deployment: where it lives in the
// struct and how to describe a good value when a bad one arrives.
type deploymentField struct {
	index []int
	want  string
}

var (
	deploymentFields     = map[string]deploymentField{}
	deploymentFieldNames []string // in struct order, for error messages
)

func init() {
	t := reflect.TypeFor[Deployment]()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		deploymentFields[name] = deploymentField{index: f.Index, want: describeJSONType(f.Type)}
		deploymentFieldNames = append(deploymentFieldNames, name)
	}
	// Taken out before the struct's fields (takeAutoscale).
	deploymentFieldNames = append(deploymentFieldNames, "target_inflight", "scale_down_delay", "idle_window")
}

func describeJSONType(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[Bytes]():
		return `a size such as "70GiB" or a number of bytes`
	case t == reflect.TypeFor[Duration]():
		return `a duration such as "2h" or "90m"`
	case t == reflect.TypeFor[*Autoscale]():
		return `an object {"min": N, "max": M, "target_inflight": T, "scale_down_delay": "5m", "idle_window": "10m"}`
	case t == reflect.TypeFor[[]Adapter]():
		return `a list of {"name": N, "source": S}`
	case t == reflect.TypeFor[*Role]():
		return `an object {"replicas": N, "tp": T}`
	case t == reflect.TypeFor[*Transfer]():
		return `an object {"backend": "nixl", "nic": "mlx5_0", "domain": "rack", "fallback": false, "skip_below": 0}`
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() == reflect.Int:
		return "an integer"
	case t.Kind() == reflect.Map:
		return "an object of string values"
	case t.Kind() == reflect.Slice:
		return "a list of strings"
	}
	return "a value of type " + t.String()
}

// DecodeDeployment reads a deployment spec strictly: one JSON object, field
// names spelled exactly as documented (encoding/json would otherwise accept
// "Replicas" for "replicas"), no unknown fields, no trailing data. It then
// fills defaults and validates: replicas is 1 when absent, and an explicit
// 0 stays 0 (scaled to zero); tensor_parallel and pipeline_parallel are 1
// when absent, and an explicit 0 is an error. Every error wraps ErrInvalidDeployment and names the field,
// or, for a body nested too deeply or holding too many values (checked
// first, see MaxSpecDepth), where the limit was passed.
//
// YAML specs are converted to JSON by the API layer before they get here.
func DecodeDeployment(data []byte) (Deployment, error) {
	invalid := func(err error) (Deployment, error) {
		return Deployment{}, fmt.Errorf("%w: %w", ErrInvalidDeployment, err)
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return invalid(errors.New("want a JSON object such as {\"name\": \"llama\", \"model\": \"meta-llama/Llama-3.1-8B-Instruct\"}"))
	}
	// Before anything that works per level or per value: the duplicate-key
	// check and the decoders below each hold state per open object and
	// allocate per value.
	if err := checkJSONShape(trimmed); err != nil {
		return invalid(err)
	}
	// Decoding into raw fields first is what makes the check strict: each
	// key is compared exactly, and each value is decoded on its own so a
	// type error names its field.
	// encoding/json keeps the last of two equal keys; a spec that says
	// replicas twice is a mistake to point at, not to guess about.
	if key, dup := duplicateKey(trimmed); dup {
		return invalid(&DuplicateFieldError{Field: key})
	}
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	if err := dec.Decode(&raw); err != nil {
		return invalid(fmt.Errorf("not valid JSON: %v", err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalid(errors.New("unexpected data after the deployment object"))
	}

	var d Deployment
	// "auto" is a value of two fields whose type is a number: it is taken
	// out here and marked, for the accepting node to resolve.
	if v, ok := raw["gpu_memory"]; ok && string(v) == `"auto"` {
		d.GPUMemoryAuto = true
		delete(raw, "gpu_memory")
	}
	if v, ok := raw["tensor_parallel"]; ok && string(v) == `"auto"` {
		d.TensorParallelAuto = true
		delete(raw, "tensor_parallel")
	}
	// replicas: {min: N, max: M} is the autoscaled form of replicas, and
	// target_inflight and scale_down_delay go with it; all are stored in
	// Autoscale (the "autoscale" object a stored spec shows, which is
	// accepted as it is too), replicas keeping a number, the start.
	ranged, err := takeAutoscale(raw)
	if err != nil {
		return invalid(err)
	}
	dv := reflect.ValueOf(&d).Elem()
	for _, name := range sortedKeys(raw) {
		f, ok := deploymentFields[name]
		if !ok {
			return invalid(&UnknownFieldError{Field: name, Valid: deploymentFieldNames})
		}
		value := raw[name]
		if string(value) == "null" {
			continue // same as absent
		}
		// Strictly, objects' fields too: a spec that says "path" for an
		// adapter's "source" is a mistake to point at. Only here, at the
		// API: a record relayed by gossip is read leniently (a field a
		// newer build added inside an object must not make an older node
		// drop the whole deployment).
		dec := json.NewDecoder(bytes.NewReader(value))
		dec.DisallowUnknownFields()
		if err := dec.Decode(dv.FieldByIndex(f.index).Addr().Interface()); err != nil {
			return invalid(&FieldError{Field: name, Value: clip(string(value), 64), Want: f.want})
		}
	}
	// given: the field is in the spec with a value (null is absent). Only
	// here can an absent field be told from an explicit 0.
	given := func(name string) bool { v, ok := raw[name]; return ok && string(v) != "null" }
	if ranged.autoscale != nil {
		if d.Autoscale != nil {
			return invalid(&DuplicateFieldError{Field: "autoscale (replicas: {min, max} says the same)"})
		}
		d.Autoscale = ranged.autoscale
	}
	if err := ranged.apply(&d); err != nil {
		return invalid(err)
	}
	if given("replicas") && d.Prefill != nil && d.Decode != nil && d.Replicas != d.Prefill.Replicas+d.Decode.Replicas {
		// A stored spec says the sum (WithDefaults); any other count
		// contradicts the roles.
		return invalid(&FieldError{Field: "replicas", Value: clip(string(raw["replicas"]), 64), Want: fmt.Sprintf("left out with prefill and decode, or their sum (%d): each role says its own count (prefill.replicas, decode.replicas)", d.Prefill.Replicas+d.Decode.Replicas)})
	}
	switch {
	case !given("replicas") && d.Autoscale != nil:
		// An autoscaled deployment starts at its min, and one that may
		// scale to zero at one replica: it falls to zero once idle.
		d.Replicas = min(max(d.Autoscale.Min, 1), d.Autoscale.Max)
	case !given("replicas"):
		d.Replicas = 1
	}
	// WithDefaults turns a zero tensor_parallel or pipeline_parallel into
	// 1, which is right for a field left out (a Deployment's zero value)
	// but ran an explicit 0 as 1 without a word: an explicit 0 is kept,
	// for Validate to refuse with the values it takes.
	tpZero := given("tensor_parallel") && d.TensorParallel == 0
	ppZero := given("pipeline_parallel") && d.PipelineParallel == 0
	d = normalize(d.WithDefaults())
	if tpZero {
		d.TensorParallel = 0
	}
	if ppZero {
		d.PipelineParallel = 0
	}
	if given("start_timeout") && d.StartTimeout == 0 {
		// Zero is how a spec says "unset", so an explicit 0 would be
		// taken silently as the default; it is more likely a mistake.
		return invalid(&FieldError{Field: "start_timeout", Value: "0s", Want: "a duration above 0 and at most 168h (7 days), such as 2h (or leave it out: 2h)"})
	}
	// The same for the engine's context and concurrency: left out, the
	// engine (or gpu_memory: auto) decides; an explicit 0 asks for no
	// context or no sequence, which no engine can serve.
	for _, f := range []struct {
		name string
		v    int
		want string
	}{
		{"max_model_len", d.MaxModelLen, "a context length from 1 to 16777216 tokens (or leave it out: the model's own)"},
		{"max_num_seqs", d.MaxNumSeqs, "from 1 to 65536 concurrent sequences (or leave it out: with gpu_memory auto as many as the GPU holds, up to 16; else the engine's own limit)"},
	} {
		if given(f.name) && f.v == 0 {
			return invalid(&FieldError{Field: f.name, Value: "0", Want: f.want})
		}
	}
	if err := d.Validate(); err != nil {
		return invalid(err)
	}
	return d, nil
}

// autoscaleFields are what takeAutoscale took out of a spec's raw fields.
type autoscaleFields struct {
	// autoscale is from replicas: {min, max} (nil: replicas was a number
	// or absent).
	autoscale *Autoscale
	// targetInflight and scaleDownDelay are the top-level fields, when
	// given.
	targetInflight *int
	scaleDownDelay *Duration
	idleWindow     *Duration
}

// takeAutoscale takes replicas: {min, max}, target_inflight and
// scale_down_delay out of raw.
func takeAutoscale(raw map[string]json.RawMessage) (autoscaleFields, error) {
	var out autoscaleFields
	if v, ok := raw["replicas"]; ok && len(bytes.TrimSpace(v)) > 0 && bytes.TrimSpace(v)[0] == '{' {
		want := "a number of replicas, or {min: N, max: M} for the cluster to choose within"
		var m map[string]json.RawMessage
		if err := json.Unmarshal(v, &m); err != nil {
			return out, &FieldError{Field: "replicas", Value: clip(string(v), 64), Want: want}
		}
		a := &Autoscale{}
		for _, k := range sortedKeys(m) {
			var dst *int
			switch k {
			case "min":
				dst = &a.Min
			case "max":
				dst = &a.Max
			default:
				return out, &UnknownFieldError{Field: "replicas." + k, Valid: []string{"min", "max"}}
			}
			if err := json.Unmarshal(m[k], dst); err != nil {
				return out, &FieldError{Field: "replicas." + k, Value: clip(string(m[k]), 64), Want: "an integer"}
			}
		}
		for _, k := range []string{"min", "max"} {
			if _, ok := m[k]; !ok {
				return out, &FieldError{Field: "replicas." + k, Value: "(missing)", Want: "given: replicas: {min: N, max: M} needs both"}
			}
		}
		out.autoscale = a
		delete(raw, "replicas")
	}
	if v, ok := raw["target_inflight"]; ok && string(v) != "null" {
		var n int
		if err := json.Unmarshal(v, &n); err != nil || n == 0 {
			return out, &FieldError{Field: "target_inflight", Value: clip(string(v), 64), Want: "from 1 to 65536 requests per replica (or leave it out: max_num_seqs, else 8)"}
		}
		out.targetInflight = &n
	}
	delete(raw, "target_inflight")
	if v, ok := raw["scale_down_delay"]; ok && string(v) != "null" {
		var d Duration
		if err := json.Unmarshal(v, &d); err != nil || d == 0 {
			return out, &FieldError{Field: "scale_down_delay", Value: clip(string(v), 64), Want: "a duration from 1s to 24h (or leave it out: 5m)"}
		}
		out.scaleDownDelay = &d
	}
	delete(raw, "scale_down_delay")
	if v, ok := raw["idle_window"]; ok && string(v) != "null" {
		var d Duration
		if err := json.Unmarshal(v, &d); err != nil || d == 0 {
			return out, &FieldError{Field: "idle_window", Value: clip(string(v), 64), Want: "a duration from 1s to 24h (or leave it out: 10m)"}
		}
		out.idleWindow = &d
	}
	delete(raw, "idle_window")
	return out, nil
}

// apply puts the top-level scaling fields into d's Autoscale, which must
// exist: alone they would scale nothing.
func (f autoscaleFields) apply(d *Deployment) error {
	for _, g := range []struct {
		name, value string
		given       bool
		set         func(a *Autoscale) bool // false: already set in autoscale
	}{
		{"target_inflight", fmt.Sprint(deref(f.targetInflight)), f.targetInflight != nil, func(a *Autoscale) bool {
			ok := a.TargetInflight == 0
			a.TargetInflight = *f.targetInflight
			return ok
		}},
		{"scale_down_delay", deref(f.scaleDownDelay).String(), f.scaleDownDelay != nil, func(a *Autoscale) bool {
			ok := a.ScaleDownDelay == 0
			a.ScaleDownDelay = *f.scaleDownDelay
			return ok
		}},
		{"idle_window", deref(f.idleWindow).String(), f.idleWindow != nil, func(a *Autoscale) bool {
			ok := a.IdleWindow == 0
			a.IdleWindow = *f.idleWindow
			return ok
		}},
	} {
		if !g.given {
			continue
		}
		if d.Autoscale == nil {
			return &FieldError{Field: g.name, Value: g.value, Want: "only with replicas: {min: N, max: M}: a fixed replica count does not scale"}
		}
		if !g.set(d.Autoscale) {
			return &DuplicateFieldError{Field: g.name + " (also in autoscale)"}
		}
	}
	return nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// normalize drops empty maps and lists, so a decoded spec equals itself
// after a JSON round trip (omitempty writes neither nil nor empty ones).
func normalize(d Deployment) Deployment {
	if len(d.Labels) == 0 {
		d.Labels = nil
	}
	if len(d.Env) == 0 {
		d.Env = nil
	}
	if len(d.Args) == 0 {
		d.Args = nil
	}
	return d
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// duplicateKey reports the first key that appears twice in one JSON
// object of data, nested objects included (as "labels.zone"). Malformed
// JSON reports nothing: the decoder that follows says what is wrong.
//
// The dotted path is built only for the answer: building it for every
// value made a body of long keys and many values cost the product of the
// two.
func duplicateKey(data []byte) (string, bool) {
	type frame struct {
		object    bool
		keys      map[string]bool
		expectKey bool
		key       string // the key whose value comes next
	}
	var stack []*frame
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				return "", false
			}
			continue
		}
		if k, ok := tok.(string); ok && top != nil && top.object && top.expectKey {
			if top.keys[k] {
				// Every enclosing frame's key is the one whose value
				// holds the next frame.
				var path strings.Builder
				for _, f := range stack[:len(stack)-1] {
					if f.object {
						path.WriteString(f.key + ".")
					}
				}
				return path.String() + k, true
			}
			top.keys[k], top.expectKey, top.key = true, false, k
			continue
		}
		// A value: a scalar, or the start of an object or array.
		if top != nil && top.object {
			top.expectKey = true
		}
		if d, ok := tok.(json.Delim); ok {
			f := &frame{object: d == '{', expectKey: d == '{'}
			if f.object {
				f.keys = map[string]bool{}
			}
			stack = append(stack, f)
		}
	}
}
