package spec

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/internal/testmem"
	"github.com/llmgw/llmgw/placement"
)

// DecodeSpec takes exactly one deployment, and says so when a body holds
// more than one, or a key twice, instead of keeping part of it.
func TestDecodeSpecRefusesWhatItWouldHalfApply(t *testing.T) {
	for _, tc := range []struct {
		name, body, ctype, wantErr string
	}{
		{"two YAML documents", "name: a\nmodel: m\n---\nname: b\nmodel: m\n", "application/yaml", "several YAML documents"},
		{"a YAML key twice", "name: a\nmodel: m\nreplicas: 1\nreplicas: 2\n", "application/yaml", "replicas"},
		{"a JSON key twice", `{"name":"a","model":"m","replicas":1,"replicas":2}`, "application/json", "replicas: given more than once"},
		{"YAML tensor_parallel: 0", "name: a\nmodel: m\ntensor_parallel: 0\n", "application/yaml", `tensor_parallel: invalid value "0": an integer from 1 to 64`},
		{"YAML pipeline_parallel: 0", "name: a\nmodel: m\npipeline_parallel: 0\n", "application/yaml", `pipeline_parallel: invalid value "0": an integer from 1 to 64`},
		{"llama.cpp across nodes", "name: a\nmodel: /w/m.gguf\nengine: llamacpp\npipeline_parallel: 2\n", "application/yaml", "llama.cpp has no multi-node launch"},
		{"an unknown update strategy", `{"name":"a","model":"m","update":"rolling"}`, "application/json", `update: invalid value "rolling"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.body), tc.ctype)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, placement.ErrInvalidDeployment) {
				t.Fatalf("got %v, want an invalid-deployment error containing %q", err, tc.wantErr)
			}
		})
	}
	for _, body := range []string{
		"---\nname: a\nmodel: m\n",                   // a leading marker is one document
		"# a comment\n---\nname: a\nmodel: m\n...\n", // and so are comments and an end marker
		"name: a\nmodel: m\nargs:\n  - |\n    ---\n", // "---" inside a block scalar is text
	} {
		d, err := Decode([]byte(body), "application/yaml")
		if err != nil || d.Name != "a" {
			t.Errorf("%q: %+v, %v; want deployment a", body, d, err)
		}
	}
}

// A body whose decoding would cost far more than its size is refused by
// its shape before any parser builds anything from it, and the refusal
// says what is wrong and what to do. Before the fix 600 KB of nested JSON
// objects took 10 GB, 50 KB of nested YAML mappings 120 MB, and 600 KB of
// a YAML list 150 MB.
func TestDecodeSpecRefusesCostlyBodies(t *testing.T) {
	for _, h := range hostileSpecs(600000) {
		t.Run(h.name, func(t *testing.T) {
			body := []byte(h.body)
			var err error
			got := testmem.Allocated(func() { _, err = Decode(body, h.ctype) })
			if err == nil || !errors.Is(err, placement.ErrInvalidDeployment) || !strings.Contains(err.Error(), h.wantErr) {
				t.Fatalf("err = %.200v; want an invalid-deployment error saying %q", err, h.wantErr)
			}
			// Refused before parsing: far below even the budget.
			if limit := uint64(64 << 10); testmem.Exact() && got > limit {
				t.Errorf("a %d-byte body allocated %d bytes before it was refused, want at most %d", len(body), got, limit)
			}
		})
	}
}

// The shape checks refuse nothing a person writes, and every valid spec,
// even one as large as validation allows, fits them in YAML and in JSON.
func TestDecodeSpecAcceptsOrdinarySpecs(t *testing.T) {
	for _, body := range ordinarySpecs {
		d, err := Decode([]byte(body), "")
		if err != nil || d.Name != "chat" {
			t.Errorf("%q: %+v, %v; want deployment chat", body, d, err)
		}
	}
	d, err := Decode([]byte(ordinarySpecs[2]), "")
	if err != nil {
		t.Fatal(err)
	}
	wantArgs := []string{"--max-model-len=8192", `--chat-template={"a": [1]}`, "--x=it's", "--y=[a]"}
	if strings.Join(d.Args, " ") != strings.Join(wantArgs, " ") || d.Model != "m # not a comment" || d.Labels["rack"] != "b: c" {
		t.Errorf("decoded %+v", d)
	}

	var y, j strings.Builder
	y.WriteString("name: big\nmodel: m\nlabels:\n")
	big := placement.Deployment{Name: "big", Model: "m", Labels: map[string]string{}, Env: map[string]string{}}
	for i := range 256 {
		fmt.Fprintf(&y, "  zone%d: a\n", i)
		big.Labels[fmt.Sprintf("zone%d", i)] = "a"
	}
	y.WriteString("env:\n")
	for i := range 1024 {
		fmt.Fprintf(&y, "  V%d: x\n", i)
		big.Env[fmt.Sprintf("V%d", i)] = "x"
	}
	y.WriteString("args:\n")
	for i := range 256 {
		fmt.Fprintf(&y, "  - --a%d\n", i)
		big.Args = append(big.Args, fmt.Sprintf("--a%d", i))
	}
	b, _ := json.Marshal(big)
	j.Write(b)
	for _, body := range []string{y.String(), j.String()} {
		if d, err := Decode([]byte(body), ""); err != nil || len(d.Env) != 1024 || len(d.Labels) != 256 || len(d.Args) != 256 {
			t.Errorf("the largest valid spec (%.20q…): %d labels, %d env, %d args, %v", body, len(d.Labels), len(d.Env), len(d.Args), err)
		}
	}
}

// A gang that cannot surge says update: recreate, in YAML as in JSON.
func TestDecodeSpecUpdateRecreate(t *testing.T) {
	for _, body := range []string{"name: big\nmodel: m\npipeline_parallel: 2\nupdate: recreate\n", `{"name":"big","model":"m","pipeline_parallel":2,"update":"recreate"}`} {
		d, err := Decode([]byte(body), "")
		if err != nil || d.Update != placement.UpdateRecreate || d.PipelineParallel != 2 {
			t.Errorf("%q: %+v, %v", body, d, err)
		}
	}
}
