package placement

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
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
