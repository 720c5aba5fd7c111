package profile

import (
	"slices"
	"strconv"
	"testing"

	"github.com/llmgw/llmgw/placement"
)

// renderLlamacpp is the argv the built-in llamacpp profile renders for d on
// a node with 80 GiB GPUs.
func renderLlamacpp(t *testing.T, d placement.Deployment) []string {
	t.Helper()
	p, err := Lookup("llamacpp")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	cmd, _, _, err := Resolve(p, d, Inputs{Port: 8080, GPUMemoryTotal: 80 << 30})
	if err != nil {
		t.Fatal(err)
	}
	return cmd
}

// flagValue is the element after flag in cmd, and whether flag is there
// exactly once (a second copy would leave llama.cpp the last one).
func flagValue(cmd []string, flag string) (string, bool) {
	i := slices.Index(cmd, flag)
	if i < 0 || i+1 >= len(cmd) || slices.Index(cmd[i+1:], flag) >= 0 {
		return "", false
	}
	return cmd[i+1], true
}

// llama.cpp's -c is the whole KV context split over the -np slots, so a
// deployment's max_model_len per sequence and max_num_seqs give
// -c = max_model_len × max_num_seqs and -np = max_num_seqs, one KV stream
// per slot, --fit off and every layer on the GPUs in equal parts: the
// whole command line, so a flag that goes missing or moves shows.
func TestLlamacppContextSlotsAndMemory(t *testing.T) {
	d := placement.Deployment{Name: "chat", Model: "/weights/q4.gguf", Engine: "llamacpp", Replicas: 1,
		TensorParallel: 2, GPUMemory: 40 << 30, MaxModelLen: 8192, MaxNumSeqs: 4}
	want := []string{"/app/llama-server", "--model", "/weights/q4.gguf", "--alias", "chat",
		"--host", "0.0.0.0", "--port", "8080",
		"-np", "4", "-c", "32768", "--no-kv-unified", "--fit", "off", "--n-gpu-layers", "999",
		"--split-mode", "layer", "--tensor-split", "1,1", "--metrics"}
	if got := renderLlamacpp(t, d); !slices.Equal(got, want) {
		t.Errorf("argv\n got %q\nwant %q", got, want)
	}
}

// A gpu_memory: auto deployment stores max_model_len and the max_num_seqs
// llmgw chose for it; the engine gets exactly those, and with TP 4 a
// quarter of the layers on each GPU.
func TestLlamacppAutoSizedUsesStoredFigures(t *testing.T) {
	d := placement.Deployment{Name: "chat", Model: "/weights/q4.gguf", Engine: "llamacpp", Replicas: 1,
		TensorParallel: 4, GPUMemory: 61 << 30, GPUMemoryAuto: true, MaxModelLen: 32768, MaxNumSeqs: 6}
	cmd := renderLlamacpp(t, d)
	for flag, want := range map[string]string{"-np": "6", "-c": "196608", "--fit": "off", "--tensor-split": "1,1,1,1", "--split-mode": "layer"} {
		if got, ok := flagValue(cmd, flag); !ok || got != want {
			t.Errorf("%s = %q (once: %v), want %q: %q", flag, got, ok, want, cmd)
		}
	}
	if !slices.Contains(cmd, "--no-kv-unified") {
		t.Errorf("no --no-kv-unified: %q", cmd)
	}
}

// Unset figures get llmgw's defaults (4 slots of 4096 tokens), not
// llama.cpp's own (the model's training context, auto slots, memory
// fitted to what is free); one GPU gets no split flags.
func TestLlamacppDefaultsWhenUnset(t *testing.T) {
	seqLen, seqs := strconv.Itoa(llamacppDefaultSeqLen), strconv.Itoa(llamacppDefaultSeqs)
	for _, tc := range []struct {
		name         string
		maxLen, seqs int
		wantC, wantN string
	}{
		{"neither", 0, 0, "16384", seqs},
		{"max_model_len only", 8192, 0, "32768", seqs},
		{"max_num_seqs only", 0, 2, "8192", "2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := placement.Deployment{Name: "gguf", Model: "/weights/q4.gguf", Engine: "llamacpp", Replicas: 1,
				GPUMemory: 20 << 30, MaxModelLen: tc.maxLen, MaxNumSeqs: tc.seqs}
			cmd := renderLlamacpp(t, d)
			if got, ok := flagValue(cmd, "-c"); !ok || got != tc.wantC {
				t.Errorf("-c = %q (once: %v), want %s (default %s a slot): %q", got, ok, tc.wantC, seqLen, cmd)
			}
			if got, ok := flagValue(cmd, "-np"); !ok || got != tc.wantN {
				t.Errorf("-np = %q (once: %v), want %s: %q", got, ok, tc.wantN, cmd)
			}
			if got, ok := flagValue(cmd, "--fit"); !ok || got != "off" {
				t.Errorf("--fit = %q, want off: %q", got, cmd)
			}
			if slices.Contains(cmd, "--tensor-split") || slices.Contains(cmd, "--split-mode") {
				t.Errorf("one GPU, yet split flags: %q", cmd)
			}
		})
	}
}

// llama.cpp exports no KV-cache gauge any more (kv_cache_usage_ratio was
// removed, PR #13660): the profile names none, so its KV use is unknown
// rather than read as a 0 % that never moves.
func TestLlamacppNamesNoRemovedKVMetric(t *testing.T) {
	p, err := Lookup("llamacpp")
	if err != nil {
		t.Fatal(err)
	}
	m := p.Metrics
	if m.KVCacheUsage != "" || m.KVCacheUsageFallback != "" || len(m.LoadNames().KVCache) != 0 {
		t.Errorf("KV-cache metric %q / %q: llama-server exports none", m.KVCacheUsage, m.KVCacheUsageFallback)
	}
	for what, name := range map[string]string{"running": m.Running, "waiting": m.Waiting, "prompt tokens": m.PromptTokens, "generation tokens": m.GenerationTokens} {
		if name == "" {
			t.Errorf("no %s metric", what)
		}
	}
}
