package placement

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzDecodeDeployment: never panics, and whatever it accepts survives a
// JSON round trip unchanged (what the API stores is what gossip carries).
func FuzzDecodeDeployment(f *testing.F) {
	for _, s := range []string{
		`{"name":"llama","model":"meta-llama/Llama-3.1-8B-Instruct"}`,
		`{"name":"q","model":"Qwen/Qwen3-32B","engine":"sglang","replicas":3,"tensor_parallel":4,"pipeline_parallel":2,"gpu_memory":"70GiB","gpu_type":"H100","labels":{"zone":"a"},"args":["--x"],"env":{"HF_HOME":"/w"}}`,
		`{"name":"a","model":"m","replicas":0,"gpu_memory":1048577}`,
		`{"name":"a","model":"m","gpu_memory":"1.5GiB","labels":{}}`,
		`{"name":"a","model":"org/m","gpu_memory":"auto","tensor_parallel":"auto","max_model_len":8192,"max_num_seqs":2}`,
		`{"Name":"a"}`, `[]`, `null`, `{"name":"a","model":"m"} x`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := DecodeDeployment(data)
		if err != nil {
			return
		}
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatalf("accepted spec does not marshal: %v", err)
		}
		d2, err := DecodeDeployment(b)
		if err != nil {
			t.Fatalf("re-encoded spec rejected: %v\n%s", err, b)
		}
		// The auto marks never travel: the accepting node resolves them
		// before anything is stored.
		if d.GPUMemoryAuto || d.TensorParallelAuto {
			if b2, _ := json.Marshal(d2); string(b) != string(b2) {
				t.Fatalf("round trip changed the spec: %s then %s", b, b2)
			}
			d.GPUMemoryAuto, d.TensorParallelAuto = false, false
		}
		if !reflect.DeepEqual(d, d2) {
			t.Fatalf("round trip changed the spec\nfirst  %+v\nsecond %+v", d, d2)
		}
		if d.SpecVersion() != d2.SpecVersion() {
			t.Fatal("round trip changed the spec version")
		}
	})
}

// FuzzBytes: ParseBytes never panics, String always parses back to the same
// value, and anything ParseBytes accepts formats to a canonical form.
func FuzzBytes(f *testing.F) {
	for _, s := range []string{"70GiB", "80GB", "1.5GiB", "123", "0", "18446744073709551615", "1e3KiB", "NaNB", "-0MiB"} {
		f.Add(s, uint64(0))
	}
	f.Add("", uint64(1<<53+1))
	f.Fuzz(func(t *testing.T, s string, n uint64) {
		b := Bytes(n)
		if got, err := ParseBytes(b.String()); err != nil || got != b {
			t.Fatalf("ParseBytes(%q) = %d, %v; want %d", b.String(), got, err, b)
		}
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		var back Bytes
		if err := json.Unmarshal(j, &back); err != nil || back != b {
			t.Fatalf("JSON round trip of %d: %s → %d, %v", b, j, back, err)
		}
		v, err := ParseBytes(s)
		if err != nil {
			return
		}
		if again, err := ParseBytes(v.String()); err != nil || again != v {
			t.Fatalf("%q parsed to %d, whose String %q parses to %d, %v", s, v, v.String(), again, err)
		}
	})
}
