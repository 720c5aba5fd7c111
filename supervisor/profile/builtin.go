package profile

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Optional flags are written --flag=value in one element so that the whole
// flag drops out when the value is empty (see the package doc). vLLM and
// SGLang parse with argparse, which accepts that form.
const (
	hfHome    = "{{if .WeightsDir}}HF_HOME={{.WeightsDir}}{{end}}"
	vllmUtil  = "{{if .GPUMemoryUtilization}}--gpu-memory-utilization={{.GPUMemoryUtilization}}{{end}}"
	sglangMem = "{{if .GPUMemoryUtilization}}--mem-fraction-static={{.GPUMemoryUtilization}}{{end}}"
	// The context and concurrency a gpu_memory: auto figure holds.
	vllmLen    = "{{if .MaxModelLen}}--max-model-len={{.MaxModelLen}}{{end}}"
	vllmSeqs   = "{{if .MaxNumSeqs}}--max-num-seqs={{.MaxNumSeqs}}{{end}}"
	sglangLen  = "{{if .MaxModelLen}}--context-length={{.MaxModelLen}}{{end}}"
	sglangSeqs = "{{if .MaxNumSeqs}}--max-running-requests={{.MaxNumSeqs}}{{end}}"
	// sglangKey makes SGLang demand its key on its API. It is the one
	// built-in engine that reads its key from no environment variable (see
	// Profile.KeyEnv), so its key shows on its command line.
	sglangKey = "{{if .APIKey}}--api-key={{.APIKey}}{{end}}"
	// sglangCheapHealth makes SGLang's /health the cheap check instead of a
	// one-token generation (see the sglang profile's Readiness).
	sglangCheapHealth = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0"
	// vllmReadyTimeout raises vLLM's own wait for its engine core
	// (VLLM_ENGINE_READY_TIMEOUT_S, 600 s in vllm/envs.py, the handshake
	// bound of vllm/v1/engine/core_client.py, too short for large weight
	// loads: vllm PR #35616) to the deployment's start timeout. vLLM's
	// bound is the whole start-up, counted from its launch; llmgw's is a
	// silence, extended while the log or the weights grow, so a download
	// that outlasts start_timeout while it progresses is ended by vLLM,
	// not by llmgw.
	vllmReadyTimeout = "{{if .StartTimeoutSeconds}}VLLM_ENGINE_READY_TIMEOUT_S={{.StartTimeoutSeconds}}{{end}}"
)

// gang writes a multi-node flag only for a replica that spans nodes:
// `--name=<field>` when NNodes is above 1, nothing otherwise, so a
// replica of one shard starts exactly as before.
func gang(name, field string) string {
	return "{{if gt .NNodes 1}}--" + name + "={{." + field + "}}{{end}}"
}

// gangEnv binds a gang's collective traffic to the interface that carries
// the node's advertised address. A deployment's own env wins over these
// (see Resolve), for an operator who knows better (an InfiniBand HCA).
var gangEnv = []string{
	"{{if and (gt .NNodes 1) .HostIP}}VLLM_HOST_IP={{.HostIP}}{{end}}",
	"{{if and (gt .NNodes 1) .NetIface}}NCCL_SOCKET_IFNAME={{.NetIface}}{{end}}",
	"{{if and (gt .NNodes 1) .NetIface}}GLOO_SOCKET_IFNAME={{.NetIface}}{{end}}",
}

// headless marks the members above rank 0, which serve no HTTP.
const headless = "{{if .Headless}}--headless{{end}}"

// tolerance is the readiness rule the built-in engines share, with each
// one's probe timeout and progress window: three failed probes in a row
// (K), a hung engine restarted after 2 min (R), and at the gateway 10 min
// to an answer's first byte (a 128k-token prompt queued behind others can
// take minutes to its first token) and 2 min between stream events.
func tolerance(probe, window time.Duration) Readiness {
	return Readiness{ProbeTimeout: probe, Failures: 3, ProgressWindow: window, HungRestart: 2 * time.Minute,
		FirstByteTimeout: 10 * time.Minute, StreamIdleTimeout: 2 * time.Minute}
}

// Builtin returns the profiles llmgw ships, keyed by name. Every call builds
// fresh values, so callers may change what they get.
func Builtin() map[string]Profile {
	return map[string]Profile{
		"vllm": {
			Name:  "vllm",
			Image: "vllm/vllm-openai:latest",
			// The model is positional: `vllm serve --model` is deprecated
			// and slated for removal.
			Command: []string{
				"vllm", "serve", "{{.Model}}",
				"--served-model-name", "{{.ServedName}}",
				"--tensor-parallel-size", "{{.TP}}",
				"--host", "{{.Host}}",
				"--port", "{{.Port}}",
				vllmUtil,
				vllmLen,
				vllmSeqs,
				// A gang: vLLM's own multi-node launch (no Ray). Every
				// rank runs `vllm serve` with the same model and sizes;
				// ranks above 0 are headless workers that dial rank 0.
				gang("pipeline-parallel-size", "PP"),
				gang("nnodes", "NNodes"),
				gang("node-rank", "NodeRank"),
				gang("master-addr", "MasterAddr"),
				gang("master-port", "MasterPort"),
				headless,
			},
			Env:         append([]string{hfHome, vllmReadyTimeout}, gangEnv...),
			KeyEnv:      "VLLM_API_KEY",
			HealthPath:  "/health",
			ModelsPath:  "/v1/models",
			MetricsPath: "/metrics",
			Metrics: Metrics{
				Running:              "vllm:num_requests_running",
				Waiting:              "vllm:num_requests_waiting",
				KVCacheUsage:         "vllm:kv_cache_usage_perc",
				KVCacheUsageFallback: "vllm:gpu_cache_usage_perc",
				PromptTokens:         "vllm:prompt_tokens_total",
				GenerationTokens:     "vllm:generation_tokens_total",
				PrefixCacheHits:      "vllm:prefix_cache_hits_total",
				PrefixCacheQueries:   "vllm:prefix_cache_queries_total",
				ModelLabel:           "model_name",
			},
			// vLLM's /health runs on the API server's asyncio loop, the
			// same loop that streams every answer, and only asks whether the
			// engine core died (vllm/entrypoints/serve/instrumentator/
			// health.py, later trees vllm/frontend/entrypoints/serve/
			// instrumentator/health.py: 503 on EngineDeadError alone, which
			// AsyncLLM.check_health in vllm/v1/engine/async_llm.py raises
			// only once the engine errored): under heavy load it takes
			// seconds, 30-40 s in vllm PR #38157, and proves nothing but
			// that the loop turned. A probe of 10 s, three in a row, and
			// counters frozen for 30 s are what a hung engine shows and a
			// busy one does not.
			Readiness: tolerance(10*time.Second, 30*time.Second),
		},
		"sglang": {
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
		},
		"llamacpp": {
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
		},
		"fake": {
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
			},
			// As vLLM: `llmgw engine fake` reads VLLM_API_KEY too.
			KeyEnv:      "VLLM_API_KEY",
			HealthPath:  "/health",
			ModelsPath:  "/v1/models",
			MetricsPath: "/metrics",
			Metrics: Metrics{
				Running:              "vllm:num_requests_running",
				Waiting:              "vllm:num_requests_waiting",
				KVCacheUsage:         "vllm:kv_cache_usage_perc",
				KVCacheUsageFallback: "vllm:gpu_cache_usage_perc",
				PromptTokens:         "vllm:prompt_tokens_total",
				GenerationTokens:     "vllm:generation_tokens_total",
				PrefixCacheHits:      "vllm:prefix_cache_hits_total",
				PrefixCacheQueries:   "vllm:prefix_cache_queries_total",
				ModelLabel:           "model_name",
			},
			// The fake engine answers /health at once (unless its vLLM
			// personality slows it: then it is run as --engine vllm), so a
			// short probe; the rule is vLLM's otherwise, with a shorter
			// window since its counters move with every request.
			Readiness: tolerance(2*time.Second, 10*time.Second),
		},
	}
}

// Lookup returns the built-in profile name.
func Lookup(name string) (Profile, error) {
	b := Builtin()
	p, ok := b[name]
	if !ok {
		names := make([]string, 0, len(b))
		for n := range b {
			names = append(names, n)
		}
		slices.Sort(names)
		return Profile{}, fmt.Errorf("unknown engine profile %q (have %s)", name, strings.Join(names, ", "))
	}
	return p, nil
}
