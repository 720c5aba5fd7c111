package placement

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/internal/testmem"
)

func TestDecodeDeployment(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Deployment
		wantErr string
	}{
		{
			name: "minimal gets defaults",
			in:   `{"name":"llama","model":"meta-llama/Llama-3.1-8B-Instruct"}`,
			want: Deployment{Name: "llama", Model: "meta-llama/Llama-3.1-8B-Instruct", Engine: "vllm", Replicas: 1, TensorParallel: 1, PipelineParallel: 1},
		},
		{
			name: "explicit zero replicas stays zero",
			in:   `{"name":"llama","model":"m","replicas":0}`,
			want: Deployment{Name: "llama", Model: "m", Engine: "vllm", Replicas: 0, TensorParallel: 1, PipelineParallel: 1},
		},
		{
			name: "null is absent",
			in:   `{"name":"llama","model":"m","replicas":null,"gpu_memory":null,"labels":null}`,
			want: Deployment{Name: "llama", Model: "m", Engine: "vllm", Replicas: 1, TensorParallel: 1, PipelineParallel: 1},
		},
		{
			name: "everything",
			in: `{"name":"q","model":"Qwen/Qwen3-32B","engine":"sglang","image":"lmsys/sglang:v0.4","replicas":3,
				"tensor_parallel":4,"pipeline_parallel":2,"gpu_memory":"70GiB","gpu_type":"H100",
				"labels":{"zone":"a"},"args":["--x"],"env":{"HF_HOME":"/w"}}`,
			want: Deployment{Name: "q", Model: "Qwen/Qwen3-32B", Engine: "sglang", Image: "lmsys/sglang:v0.4", Replicas: 3,
				TensorParallel: 4, PipelineParallel: 2, GPUMemory: 70 * gib, GPUType: "H100",
				Labels: map[string]string{"zone": "a"}, Args: []string{"--x"}, Env: map[string]string{"HF_HOME": "/w"}},
		},
		{
			name: "empty maps and lists are dropped",
			in:   `{"name":"a","model":"m","labels":{},"args":[],"env":{}}`,
			want: Deployment{Name: "a", Model: "m", Engine: "vllm", Replicas: 1, TensorParallel: 1, PipelineParallel: 1},
		},
		{name: "explicit zero tensor_parallel is an error, not a silent 1", in: `{"name":"a","model":"m","tensor_parallel":0}`,
			wantErr: `tensor_parallel: invalid value "0": an integer from 1 to 64`},
		{name: "explicit zero pipeline_parallel is an error, not a silent 1", in: `{"name":"a","model":"m","pipeline_parallel":0}`,
			wantErr: `pipeline_parallel: invalid value "0": an integer from 1 to 64`},
		{
			name: "null parallelism is absent",
			in:   `{"name":"a","model":"m","tensor_parallel":null,"pipeline_parallel":null}`,
			want: Deployment{Name: "a", Model: "m", Engine: "vllm", Replicas: 1, TensorParallel: 1, PipelineParallel: 1},
		},
		{name: "unknown field", in: `{"name":"a","model":"m","replica":2}`,
			wantErr: `unknown field "replica"; valid fields are name, model, engine, image, replicas, tensor_parallel`},
		{name: "wrong case is unknown", in: `{"Name":"a","model":"m"}`, wantErr: `unknown field "Name"`},
		{name: "type error names the field", in: `{"name":"a","model":"m","replicas":"two"}`,
			wantErr: `replicas: invalid value "\"two\"": an integer`},
		{name: "bad size", in: `{"name":"a","model":"m","gpu_memory":"lots"}`,
			wantErr: `gpu_memory: invalid value "\"lots\"": a size such as "70GiB"`},
		{name: "validation names the field", in: `{"name":"a","model":"m","tensor_parallel":100}`,
			wantErr: `tensor_parallel: invalid value "100"`},
		{name: "not an object", in: `[1]`, wantErr: "want a JSON object"},
		{name: "null", in: `null`, wantErr: "want a JSON object"},
		{name: "empty", in: ``, wantErr: "want a JSON object"},
		{name: "trailing data", in: `{"name":"a","model":"m"} {}`, wantErr: "unexpected data after"},
		{name: "a key given twice", in: `{"name":"a","model":"m","replicas":1,"replicas":2}`,
			wantErr: `replicas: given more than once; give each field once`},
		{name: "a nested key given twice", in: `{"name":"a","model":"m","labels":{"zone":"a","zone":"b"}}`,
			wantErr: `labels.zone: given more than once`},
		{name: "equal keys in different objects are fine", in: `{"name":"a","model":"m","labels":{"name":"x"},"env":{"name":"y"}}`,
			want: Deployment{Name: "a", Model: "m", Engine: "vllm", Replicas: 1, TensorParallel: 1, PipelineParallel: 1,
				Labels: map[string]string{"name": "x"}, Env: map[string]string{"name": "y"}}},
		{name: "broken", in: `{"name":"a",`, wantErr: "not valid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeDeployment([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				if !errors.Is(err, ErrInvalidDeployment) {
					t.Fatalf("err %v does not wrap ErrInvalidDeployment", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestDecodeErrorTypes(t *testing.T) {
	_, err := DecodeDeployment([]byte(`{"name":"a","model":"m","nope":1}`))
	var uf *UnknownFieldError
	if !errors.As(err, &uf) || uf.Field != "nope" {
		t.Fatalf("want *UnknownFieldError for nope, got %v", err)
	}
	_, err = DecodeDeployment([]byte(`{"name":"a","model":"m","engine":"x"}`))
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "engine" {
		t.Fatalf("want *FieldError for engine, got %v", err)
	}
}

func TestBytes(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Bytes
	}{
		{"70GiB", 70 << 30}, {"80GB", 80e9}, {"1.5GiB", 3 << 29}, {" 512 MiB ", 512 << 20}, {"123", 123},
		{"9007199254740993B", 9007199254740993}, {"18446744073709551615", math.MaxUint64},
	} {
		got, err := ParseBytes(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "GiB", "-1GiB", "NaNGiB", "InfGiB", "17179869184TiB", "1e30TB", "5 parsecs"} {
		if b, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) = %d, want an error", bad, b)
		}
	}
	for _, b := range []Bytes{0, 1, 1023, 1 << 10, 3 << 29, 70 << 30, 1<<53 + 1, math.MaxUint64} {
		got, err := ParseBytes(b.String())
		if err != nil || got != b {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", b.String(), got, err, b)
		}
	}
	var b Bytes = 7
	if err := json.Unmarshal([]byte("null"), &b); err != nil || b != 7 {
		t.Errorf("null changed Bytes to %d (err %v)", b, err)
	}
}

// A deeply nested body is refused by its depth, naming the limit and the
// fix, before anything is built per level. Before the fix the duplicate-key
// check built a path string per level first: 100 KB of nested objects cost
// 420 MB, 600 KB about 10 GB.
func TestDecodeDeploymentRefusesDeepNesting(t *testing.T) {
	for name, body := range map[string]string{
		"objects":           strings.Repeat(`{"a":`, 20000),
		"objects in labels": `{"name":"a","model":"m","labels":` + strings.Repeat(`{"a":`, 20000),
		"arrays in args":    `{"name":"a","model":"m","args":` + strings.Repeat(`[`, 100000),
		"one past the limit": `{"name":"a","model":"m","args":` + strings.Repeat(`[`, MaxSpecDepth) +
			strings.Repeat(`]`, MaxSpecDepth) + `}`,
	} {
		t.Run(name, func(t *testing.T) {
			var err error
			in := []byte(body)
			got := testmem.Allocated(func() { _, err = DecodeDeployment(in) })
			var ne *NestingError
			if !errors.As(err, &ne) || !errors.Is(err, ErrInvalidDeployment) {
				t.Fatalf("err = %v, want a *NestingError wrapping ErrInvalidDeployment", err)
			}
			for _, want := range []string{"nested deeper than 32 levels", "flatten it"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if limit := uint64(16 << 10); testmem.Exact() && got > limit {
				t.Errorf("a %d-byte body allocated %d bytes, want at most %d", len(body), got, limit)
			}
		})
	}
	// Brackets inside strings are text, and nesting up to the limit is no
	// nesting error (the field's own type check answers).
	if d, err := DecodeDeployment([]byte(`{"name":"a","model":"` + strings.Repeat(`[{`, 100) + `"}`)); err != nil || d.Name != "a" {
		t.Errorf("brackets in a string: %+v, %v", d, err)
	}
	_, err := DecodeDeployment([]byte(`{"name":"a","model":"m","args":` + strings.Repeat(`[`, MaxSpecDepth-1) +
		strings.Repeat(`]`, MaxSpecDepth-1) + `}`))
	var ne *NestingError
	var fe *FieldError
	if errors.As(err, &ne) || !errors.As(err, &fe) || fe.Field != "args" {
		t.Errorf("nesting at the limit: %v, want the args type error", err)
	}
}

// The duplicate-key check builds a key's dotted path only to report it:
// many values under one long key cost their own size, not the product of
// the key's length and their number (2 GB for this 300 KB body before).
// The decoder refuses so many values up front; this is what keeps the
// check itself linear behind that limit.
func TestDuplicateKeyCheckIsLinear(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"name":"a","model":"m","` + strings.Repeat("k", 100<<10) + `":{`)
	for i := range 20000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"%d":1`, i)
	}
	b.WriteString(`,"7":2}}`)
	in := []byte(b.String())
	var (
		key string
		dup bool
	)
	got := testmem.Allocated(func() { key, dup = duplicateKey(in) })
	if !dup || key != strings.Repeat("k", 100<<10)+".7" {
		t.Fatalf("duplicateKey = %.20q…, %v; want the long key's 7", key, dup)
	}
	if limit := uint64(64*len(in) + 1<<20); testmem.Exact() && got > limit {
		t.Errorf("a %d-byte body allocated %d bytes, want at most %d", len(in), got, limit)
	}
	if key, dup := duplicateKey([]byte(`{"labels":{"zone":"a"},"env":{"A":"1","A":"2"}}`)); !dup || key != "env.A" {
		t.Errorf("duplicateKey = %q, %v; want env.A", key, dup)
	}
}

// Validation bounds a spec's maps, so that every valid spec fits the
// decoder's shape limits.
func TestValidateBoundsMaps(t *testing.T) {
	d := Deployment{Name: "a", Model: "m", Labels: map[string]string{}, Env: map[string]string{}}.WithDefaults()
	for i := range maxLabels + 1 {
		d.Labels[fmt.Sprintf("k%d", i)] = "v"
	}
	var fe *FieldError
	if err := d.Validate(); !errors.As(err, &fe) || fe.Field != "labels" || !strings.Contains(err.Error(), "at most 256 labels") {
		t.Errorf("257 labels: %v", err)
	}
	d.Labels = nil
	for i := range maxEnv + 1 {
		d.Env[fmt.Sprintf("V%d", i)] = "v"
	}
	if err := d.Validate(); !errors.As(err, &fe) || fe.Field != "env" || !strings.Contains(err.Error(), "at most 1024 variables") {
		t.Errorf("1025 env vars: %v", err)
	}
}

func TestDecodeAuto(t *testing.T) {
	d, err := DecodeDeployment([]byte(`{"name": "m", "model": "org/m", "gpu_memory": "auto", "tensor_parallel": "auto", "max_model_len": 8192, "max_num_seqs": 4}`))
	if err != nil {
		t.Fatal(err)
	}
	if !d.GPUMemoryAuto || !d.TensorParallelAuto || d.GPUMemory != 0 || d.TensorParallel != 1 || d.MaxModelLen != 8192 || d.MaxNumSeqs != 4 {
		t.Errorf("decoded %+v", d)
	}
	// The marks never travel: the spec as encoded says nothing of auto
	// (the accepting node resolves it before anything is stored).
	if b, _ := json.Marshal(d); strings.Contains(string(b), "auto") {
		t.Errorf("encoded spec %s carries auto", b)
	}
	// What gossip decodes (plain encoding/json) refuses an unresolved spec.
	var g Deployment
	if err := json.Unmarshal([]byte(`{"name":"m","model":"org/m","gpu_memory":"auto"}`), &g); err == nil {
		t.Error("plain decoding took gpu_memory auto")
	}
	for body, field := range map[string]string{
		`{"name": "m", "model": "org/m", "gpu_memory": "automatic"}`: "gpu_memory",
		`{"name": "m", "model": "org/m", "max_model_len": -1}`:       "max_model_len",
		`{"name": "m", "model": "org/m", "max_num_seqs": 100000}`:    "max_num_seqs",
		// An explicit 0 or a negative count is an error, not "unset".
		`{"name": "m", "model": "org/m", "max_num_seqs": 0}`:                        "max_num_seqs",
		`{"name": "m", "model": "org/m", "gpu_memory": "auto", "max_num_seqs": 0}`:  "max_num_seqs",
		`{"name": "m", "model": "org/m", "gpu_memory": "auto", "max_num_seqs": -2}`: "max_num_seqs",
		`{"name": "m", "model": "org/m", "max_model_len": 0}`:                       "max_model_len",
	} {
		if _, err := DecodeDeployment([]byte(body)); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: error %v, want one naming %s", body, err, field)
		}
	}
}
