package profile

import (
	"slices"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/placement"
)

// LoRA turns on each engine's own way: vLLM and the fake with its flags
// and runtime updates allowed, SGLang with the sizes it needs to load
// adapters at runtime, llama.cpp with the adapters' files at start,
// applied per request. Without max_loras nothing of it is rendered.
func TestLoRAFlags(t *testing.T) {
	in := Inputs{Port: 8100, Self: "/usr/bin/llmgw", AdapterPaths: []string{"/w/sql", "/w/code"}}
	for _, tc := range []struct {
		engine   string
		args     []string
		env      []string
		noAdapts bool
	}{
		{"vllm", []string{"--enable-lora", "--max-loras=2", "--max-lora-rank=16"}, []string{"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"}, false},
		{"fake", []string{"--enable-lora", "--max-loras=2", "--max-lora-rank=16"}, []string{"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"}, false},
		{"sglang", []string{"--enable-lora", "--max-loras-per-batch=2", "--max-lora-rank=16", "--lora-target-modules=all"}, nil, false},
		{"llamacpp", []string{"--lora", "/w/sql,/w/code", "--lora-init-without-apply"}, nil, true},
	} {
		p, err := Lookup(tc.engine)
		if err != nil {
			t.Fatal(err)
		}
		d := placement.Deployment{Name: "chat", Model: "m", Engine: tc.engine, MaxLoras: 2}
		cmd, env, _, err := Resolve(p, d, in)
		if err != nil {
			t.Fatalf("%s: %v", tc.engine, err)
		}
		line := strings.Join(cmd, " ")
		if !strings.Contains(line, strings.Join(tc.args, " ")) {
			t.Errorf("%s: %s lacks %q", tc.engine, line, tc.args)
		}
		for _, e := range tc.env {
			if !slices.Contains(env, e) {
				t.Errorf("%s: env %v lacks %s", tc.engine, env, e)
			}
		}
		off := placement.Deployment{Name: "chat", Model: "m", Engine: tc.engine}
		offIn := in
		offIn.AdapterPaths = nil
		cmd, env, _, _ = Resolve(p, off, offIn)
		if line := strings.Join(append(cmd, env...), " "); strings.Contains(line, "lora") || strings.Contains(line, "LORA") {
			t.Errorf("%s without LoRA renders %s", tc.engine, line)
		}
	}
}
