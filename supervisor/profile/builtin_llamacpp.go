package profile

import "time"

// llamacppProfile is the profile of llama.cpp's llama-server.
func llamacppProfile() Profile {
	return Profile{
		Name: "llamacpp",
		// The CUDA build: the plain :server tag is CPU-only and would
		// ignore --n-gpu-layers on a GPU node without saying so.
		Image: "ghcr.io/ggml-org/llama.cpp:server-cuda",
		// The model is a GGUF file path (under the weights dir). The
		// image's binary is not on PATH, hence the absolute path.
		// llama.cpp splits layers over every visible GPU by itself.
		Command: []string{
			"/app/llama-server",
			"--model", "{{.Model}}",
			"--alias", "{{.ServedName}}",
			"--host", "{{.Host}}",
			"--port", "{{.Port}}",
			"--n-gpu-layers", "999",
			"--metrics",
		},
		// With a key llama.cpp guards /metrics too, so the load
		// scrape sends it.
		KeyEnv:      "LLAMA_API_KEY",
		HealthPath:  "/health",
		ModelsPath:  "/v1/models",
		MetricsPath: "/metrics",
		Metrics: Metrics{
			Running:          "llamacpp:requests_processing",
			Waiting:          "llamacpp:requests_deferred",
			KVCacheUsage:     "llamacpp:kv_cache_usage_ratio",
			PromptTokens:     "llamacpp:prompt_tokens_total",
			GenerationTokens: "llamacpp:tokens_predicted_total",
		},
		// llama-server answers /health from its HTTP threads without
		// touching the slots that generate (tools/server/server-context.
		// cpp, server_routes' get_health: {"status":"ok"}; loading and
		// errors are the 503 of its HTTP middleware, tools/server/
		// server-http.cpp), so a busy server answers it quickly. Same K
		// and W as the others; a shorter probe is enough.
		Readiness: tolerance(5*time.Second, 30*time.Second),
	}
}
