package profile

import "time"

// fakeProfile is the profile of the built-in fake engine.
func fakeProfile() Profile {
	return Profile{
		Name: "fake",
		// The fake engine is the llmgw binary itself; it has no image
		// of its own (a deployment may name one that contains llmgw).
		Command: []string{
			"{{.Self}}", "engine", "fake",
			"--model", "{{.ServedName}}",
			"--host", "{{.Host}}",
			"--port", "{{.Port}}",
			// The fake engine's gang mode takes vLLM's flags.
			gang("nnodes", "NNodes"),
			gang("node-rank", "NodeRank"),
			gang("master-addr", "MasterAddr"),
			gang("master-port", "MasterPort"),
			headless,
			// LoRA as vLLM takes it (the fake speaks vLLM's adapter
			// endpoints).
			"{{if .MaxLoras}}--enable-lora{{end}}",
			"{{if .MaxLoras}}--max-loras={{.MaxLoras}}{{end}}",
			"{{if .MaxLoras}}--max-lora-rank={{.MaxLoraRank}}{{end}}",
			// Prefill/decode as vLLM runs it (the fake speaks NIXL's
			// protocol over a real side channel).
			nixlConfig,
		},
		Env: []string{"{{if .MaxLoras}}VLLM_ALLOW_RUNTIME_LORA_UPDATING=True{{end}}", nixlHost, nixlPort},
		// As vLLM: `llmgw engine fake` reads VLLM_API_KEY too.
		KeyEnv:       "VLLM_API_KEY",
		HealthPath:   "/health",
		ModelsPath:   "/v1/models",
		LoRALoadPath: "/v1/load_lora_adapter", LoRAUnloadPath: "/v1/unload_lora_adapter", LoRARequest: LoRAByName,
		MetricsPath: "/metrics",
		// As vLLM: the fake engine exports vLLM's series.
		Metrics: vllmMetrics(),
		// The fake engine answers /health at once (unless its vLLM
		// personality slows it: then it is run as --engine vllm), so a
		// short probe; the rule is vLLM's otherwise, with a shorter
		// window since its counters move with every request.
		Readiness: tolerance(2*time.Second, 10*time.Second),
	}
}
