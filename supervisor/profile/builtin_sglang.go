package profile

import "time"

// Optional flags: see the const block of builtin.go for why each is one
// element.
const (
	sglangMem  = "{{if .GPUMemoryUtilization}}--mem-fraction-static={{.GPUMemoryUtilization}}{{end}}"
	sglangLen  = "{{if .MaxModelLen}}--context-length={{.MaxModelLen}}{{end}}"
	sglangSeqs = "{{if .MaxNumSeqs}}--max-running-requests={{.MaxNumSeqs}}{{end}}"
	// sglangKey makes SGLang demand its key on its API. It is the one
	// built-in engine that reads its key from no environment variable (see
	// Profile.KeyEnv), so its key shows on its command line.
	sglangKey = "{{if .APIKey}}--api-key={{.APIKey}}{{end}}"
	// sglangCheapHealth makes SGLang's /health the cheap check instead of a
	// one-token generation (see the sglang profile's Readiness).
	sglangCheapHealth = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0"
)

// sglangProfile is the profile of SGLang.
func sglangProfile() Profile {
	return Profile{
		Name:  "sglang",
		Image: "lmsysorg/sglang:latest",
		Command: []string{
			"python3", "-m", "sglang.launch_server",
			"--model-path", "{{.Model}}",
			"--served-model-name", "{{.ServedName}}",
			// SGLang counts every GPU of the gang in its TP size.
			"--tp-size", "{{.TPTotal}}",
			"--host", "{{.Host}}",
			"--port", "{{.Port}}",
			// Without it SGLang serves no /metrics.
			"--enable-metrics",
			sglangMem,
			sglangLen,
			sglangSeqs,
			sglangKey,
			gang("nnodes", "NNodes"),
			gang("node-rank", "NodeRank"),
			"{{if gt .NNodes 1}}--dist-init-addr={{.MasterAddr}}:{{.MasterPort}}{{end}}",
		},
		Env:         append([]string{hfHome, sglangCheapHealth}, gangEnv...),
		HealthPath:  "/health",
		ModelsPath:  "/v1/models",
		MetricsPath: "/metrics",
		Metrics: Metrics{
			Running:          "sglang:num_running_reqs",
			Waiting:          "sglang:num_queue_reqs",
			KVCacheUsage:     "sglang:token_usage",
			PromptTokens:     "sglang:prompt_tokens_total",
			GenerationTokens: "sglang:generation_tokens_total",
			ModelLabel:       "model_name",
		},
		// SGLang's /health is health_generate by default: it submits a
		// one-token generation and polls once a second until output
		// arrives, up to SGLANG_HEALTH_CHECK_TIMEOUT, 20 s
		// (python/sglang/srt/entrypoints/http_server.py). The profile's
		// env turns that off (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0,
		// an EnvBool defaulting to true in python/sglang/srt/environ.py:
		// health_generate then answers "/health" 200 at once, unless the
		// server is starting or shutting down), so /health is the cheap
		// check of the server's loop, and progress comes from the token
		// counters (not sglang:num_running_reqs, a gauge that can stay
		// stale for 30 s after going idle: sglang PR #26495).
		Readiness: tolerance(10*time.Second, 30*time.Second),
	}
}
