package profile

import (
	"slices"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/placement"
)

// SGLang's --mem-fraction-static is sized from the free memory read at the
// start: (share − what SGLang keeps for activations and CUDA graphs) / the
// smallest free reading. An 80 GiB GPU at TP 2 keeps 13.25 GiB by SGLang's
// own estimate (512 + 8192 × 1.5 + 256 × 2 + 2 / 8 × 1024 MiB), so a
// 40 GiB share has 26.75 GiB of weights and KV.
func TestSGLangFractionFromFreeMemory(t *testing.T) {
	p, _ := Lookup("sglang")
	d := placement.Deployment{Name: "s", Model: "m", TensorParallel: 2, GPUMemory: 40 * gib}
	for _, tc := range []struct {
		name    string
		free    []uint64
		want    string // the flag, or "" with wantErr
		wantErr string
	}{
		{"empty GPU", []uint64{79 * gib, 79 * gib}, "--mem-fraction-static=0.33", ""},
		{"shared GPU", []uint64{45 * gib, 46 * gib}, "--mem-fraction-static=0.59", ""},
		// SGLang sizes by the smallest rank.
		{"slightly uneven", []uint64{79 * gib, 75 * gib}, "--mem-fraction-static=0.35", ""},
		{"not enough free", []uint64{39 * gib, 39 * gib}, "", "exceeds the 39GiB free now"},
		{"unbalanced", []uint64{79 * gib, 60 * gib}, "", "unbalanced"},
	} {
		cmd, _, _, err := Resolve(p, d, Inputs{Port: 1, GPUMemoryTotal: 80 * gib, GPUFree: tc.free})
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: err = %v, want one saying %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Contains(cmd, tc.want) {
			t.Errorf("%s: command %q lacks %s", tc.name, cmd, tc.want)
		}
	}
}

// Without a free-memory reading (simulated GPUs) SGLang gets the share of
// total memory, as before; vLLM's flag is a fraction of total whatever is
// free, so a reading changes nothing for it.
func TestFractionWithoutFreeReadingAndForVLLM(t *testing.T) {
	d := placement.Deployment{Name: "s", Model: "m", GPUMemory: 40 * gib}
	sg, _ := Lookup("sglang")
	cmd, _, _, err := Resolve(sg, d, Inputs{Port: 1, GPUMemoryTotal: 80 * gib})
	if err != nil || !slices.Contains(cmd, "--mem-fraction-static=0.50") {
		t.Errorf("sglang without GPUFree: %q, %v; want --mem-fraction-static=0.50", cmd, err)
	}
	vl, _ := Lookup("vllm")
	cmd, _, _, err = Resolve(vl, d, Inputs{Port: 1, GPUMemoryTotal: 80 * gib, GPUFree: []uint64{45 * gib}})
	if err != nil || !slices.Contains(cmd, "--gpu-memory-utilization=0.50") {
		t.Errorf("vllm with GPUFree: %q, %v; want --gpu-memory-utilization=0.50", cmd, err)
	}
}

// A share smaller than SGLang's own activation reserve leaves nothing for
// the model: refused with the reason rather than started to fail.
func TestSGLangShareBelowReserve(t *testing.T) {
	p, _ := Lookup("sglang")
	d := placement.Deployment{Name: "s", Model: "m", GPUMemory: 8 * gib}
	_, _, _, err := Resolve(p, d, Inputs{Port: 1, GPUMemoryTotal: 80 * gib, GPUFree: []uint64{79 * gib}})
	if err == nil || !strings.Contains(err.Error(), "raise gpu_memory") {
		t.Errorf("err = %v, want one saying to raise gpu_memory", err)
	}
}

// SGLang's key goes in the 0600 YAML its --config names, never on the
// command line, when the runner writes files; quoted so a key that looks
// like a number stays a string.
func TestSGLangKeyInConfigFile(t *testing.T) {
	p, _ := Lookup("sglang")
	d := placement.Deployment{Name: "s", Model: "m"}
	in := Inputs{Port: 1, APIKey: "12e3'x", FilesDir: "/data/engines/e1"}
	cmd, _, _, err := Resolve(p, d, in)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cmd {
		if strings.Contains(a, in.APIKey) {
			t.Errorf("command %q carries the key", cmd)
		}
	}
	i := slices.Index(cmd, "--config")
	if i < 0 || i+1 >= len(cmd) || cmd[i+1] != "/data/engines/e1/sglang.yaml" {
		t.Fatalf("command %q lacks --config /data/engines/e1/sglang.yaml as two elements", cmd)
	}
	files, err := Files(p, d, in)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"sglang.yaml": "api-key: '12e3''x'\n"}; len(files) != 1 || files["sglang.yaml"] != want["sglang.yaml"] {
		t.Errorf("files = %q, want %q", files, want)
	}
	// Without a key: no --config and no file.
	cmd, _, _, _ = Resolve(p, d, Inputs{Port: 1, FilesDir: "/f"})
	files, _ = Files(p, d, Inputs{Port: 1, FilesDir: "/f"})
	if slices.Contains(cmd, "--config") || len(files) != 0 {
		t.Errorf("without a key: command %q, files %q", cmd, files)
	}
	// A runner that writes no files keeps the key working on argv.
	cmd, _, _, _ = Resolve(p, d, Inputs{Port: 1, APIKey: "k"})
	if !slices.Contains(cmd, "--api-key=k") || slices.Contains(cmd, "--config") {
		t.Errorf("without FilesDir: command %q, want --api-key=k", cmd)
	}
}

// vLLM and SGLang get a concurrency cap only when the user gave
// max_num_seqs: a figure llmgw chose for sizing (Fit.SeqsChosen) is not
// one, and their KV cache bounds them otherwise.
func TestConcurrencyFlagOnlyWhenGiven(t *testing.T) {
	flags := map[string]string{"vllm": "--max-num-seqs=16", "sglang": "--max-running-requests=16"}
	for name, flag := range flags {
		p, _ := Lookup(name)
		given := placement.Deployment{Name: "s", Model: "m", MaxNumSeqs: 16, Fit: &placement.Fit{}}
		cmd, _, _, err := Resolve(p, given, Inputs{Port: 1})
		if err != nil || !slices.Contains(cmd, flag) {
			t.Errorf("%s, given: %q, %v; want %s", name, cmd, err, flag)
		}
		chosen := given
		chosen.Fit = &placement.Fit{SeqsChosen: true}
		cmd, _, _, err = Resolve(p, chosen, Inputs{Port: 1})
		if err != nil || slices.Contains(cmd, flag) {
			t.Errorf("%s, chosen by llmgw: %q, %v; want no %s", name, cmd, err, flag)
		}
	}
}

// Compile caches live under the node's cache dir when it has one.
func TestCompileCachesUnderCacheDir(t *testing.T) {
	for name, want := range map[string][]string{
		"vllm":   {"VLLM_CACHE_ROOT=/c/vllm", "TORCHINDUCTOR_CACHE_DIR=/c/torchinductor", "TRITON_CACHE_DIR=/c/triton"},
		"sglang": {"TORCHINDUCTOR_CACHE_DIR=/c/torchinductor", "TRITON_CACHE_DIR=/c/triton"},
	} {
		p, _ := Lookup(name)
		_, env, _, err := Resolve(p, placement.Deployment{Name: "s", Model: "m"}, Inputs{Port: 1, CacheDir: "/c"})
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range want {
			if !slices.Contains(env, kv) {
				t.Errorf("%s: env %q lacks %s", name, env, kv)
			}
		}
		_, env, _, _ = Resolve(p, placement.Deployment{Name: "s", Model: "m"}, Inputs{Port: 1})
		for _, kv := range env {
			if strings.Contains(kv, "CACHE_DIR=") || strings.Contains(kv, "CACHE_ROOT=") {
				t.Errorf("%s without a cache dir: %s", name, kv)
			}
		}
	}
}

// A profile from a file is checked at load: an unknown memory_fraction and
// a file name with a directory in it are refused.
func TestValidateMemoryFractionAndFiles(t *testing.T) {
	p, _ := Lookup("sglang")
	p.MemoryFraction = "free"
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "memory_fraction") {
		t.Errorf("err = %v", err)
	}
	p, _ = Lookup("sglang")
	p.Files = map[string]string{"../x.yaml": "a: b"}
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "plain file name") {
		t.Errorf("err = %v", err)
	}
}
