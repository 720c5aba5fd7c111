package profile

import (
	"slices"
	"time"
)

// Optional flags: see the const block of builtin.go for why each is one
// element.
const (
	vllmUtil = "{{if .GPUMemoryUtilization}}--gpu-memory-utilization={{.GPUMemoryUtilization}}{{end}}"
	// The context and concurrency a gpu_memory: auto figure holds.
	vllmLen = "{{if .MaxModelLen}}--max-model-len={{.MaxModelLen}}{{end}}"
	// A concurrency cap only when the user gave one: vLLM admits
	// sequences while its KV cache holds them, and a figure llmgw chose
	// for sizing (placement.Fit.SeqsChosen) is no cap the user asked for.
	vllmSeqs = "{{if .MaxNumSeqsGiven}}--max-num-seqs={{.MaxNumSeqs}}{{end}}"
	// vllmCache keeps vLLM's own caches (torch.compile artefacts under
	// torch_compile_cache, vllm/envs.py VLLM_CACHE_ROOT) across restarts.
	vllmCache = "{{if .CacheDir}}VLLM_CACHE_ROOT={{.CacheDir}}/vllm{{end}}"
	// vllmReadyTimeout raises vLLM's own wait for its engine core
	// (VLLM_ENGINE_READY_TIMEOUT_S, 600 s in vllm/envs.py, the handshake
	// bound of vllm/v1/engine/core_client.py, too short for large weight
	// loads: vllm PR #35616) to the deployment's start timeout. vLLM's
	// bound is the whole start-up, counted from its launch; llmgw's is a
	// silence, extended while the log or the weights grow, so a download
	// that outlasts start_timeout while it progresses is ended by vLLM,
	// not by llmgw.
	vllmReadyTimeout = "{{if .StartTimeoutSeconds}}VLLM_ENGINE_READY_TIMEOUT_S={{.StartTimeoutSeconds}}{{end}}"
	// vLLM's own traces (a span per request, continuing the gateway's
	// traceparent), sent where the node sends its own when the operator
	// opts in (llmgw node up --otlp-engines). Opt-in because the pinned
	// image cannot: it is built by vLLM's docker/Dockerfile, whose openai
	// stage installs no OpenTelemetry package, and requirements/common.txt
	// names none, while vLLM refuses to start with --otlp-traces-endpoint
	// when opentelemetry cannot be imported ("OpenTelemetry is not
	// available": init_tracer in vllm/tracing.py, and in later trees the
	// otlp_traces_endpoint validator of ObservabilityConfig,
	// vllm/config/observability.py). An image with opentelemetry-sdk and
	// opentelemetry-exporter-otlp-proto-http added can turn it on.
	vllmOTLP = "{{if .OTLPTracesEndpoint}}--otlp-traces-endpoint={{.OTLPTracesEndpoint}}{{end}}"
	// The exporter's protocol: vLLM defaults to gRPC
	// (get_span_exporter in vllm/tracing.py reads
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, "grpc" when unset), and the
	// node's collector is the OTLP/HTTP one the node exports to.
	vllmOTLPProtocol = "{{if .OTLPTracesEndpoint}}OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf{{end}}"
	// The service its spans name (the OpenTelemetry SDK's resource reads
	// OTEL_SERVICE_NAME; without it they come from "unknown_service"),
	// beside the node's own "llmgw".
	vllmOTLPService = "{{if .OTLPTracesEndpoint}}OTEL_SERVICE_NAME=vllm{{end}}"
	// LoRA: the GPU slots (adapters in one batch) and the largest rank
	// size buffers vLLM allocates at start (LoRAConfig in
	// vllm/config/lora.py); adapters are loaded at runtime through
	// /v1/load_lora_adapter, which vLLM serves only with
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING set (vllm/envs.py; the route is
	// added in vllm/entrypoints/openai/api_server.py only then).
	vllmLoRA        = "{{if .MaxLoras}}--enable-lora{{end}}"
	vllmMaxLoras    = "{{if .MaxLoras}}--max-loras={{.MaxLoras}}{{end}}"
	vllmMaxLoraRank = "{{if .MaxLoras}}--max-lora-rank={{.MaxLoraRank}}{{end}}"
	vllmLoRARuntime = "{{if .MaxLoras}}VLLM_ALLOW_RUNTIME_LORA_UPDATING=True{{end}}"
	// Prefill/decode disaggregation through vLLM's NixlConnector
	// (docs/features/nixl_connector_usage.md): every worker of either
	// role runs kv_both, the gateway's legs say which part a request
	// takes, and a failed KV load fails the request instead of
	// recomputing it unseen. Each worker's side channel listens on
	// VLLM_NIXL_SIDE_CHANNEL_HOST at VLLM_NIXL_SIDE_CHANNEL_PORT plus its
	// rank, so the port is the first of a block (supervisor/engine);
	// the host is the node's address, which decode engines on other
	// nodes dial. UCX_NET_DEVICES pins NIXL's UCX backend to the NIC.
	nixlConfig = `{{if .Role}}--kv-transfer-config={"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"fail"}{{end}}`
	nixlHost   = "{{if .Role}}VLLM_NIXL_SIDE_CHANNEL_HOST={{.KVHost}}{{end}}"
	nixlPort   = "{{if .Role}}VLLM_NIXL_SIDE_CHANNEL_PORT={{.KVPort}}{{end}}"
	nixlNIC    = "{{if and .Role .NIC}}UCX_NET_DEVICES={{.NIC}}:1{{end}}"
)

// vllmProfile is the profile of vLLM.
func vllmProfile() Profile {
	return Profile{
		Name:  "vllm",
		Image: PinnedVLLMImage,
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
			// The bare address, IPv6 too: vLLM brackets it itself
			// (get_tcp_uri in vllm/utils/network_utils.py).
			gang("master-addr", "MasterAddr"),
			gang("master-port", "MasterPort"),
			headless,
			vllmOTLP,
			vllmLoRA,
			vllmMaxLoras,
			vllmMaxLoraRank,
			nixlConfig,
		},
		Env:          slices.Concat([]string{hfHome, vllmReadyTimeout, vllmCache, vllmOTLPProtocol, vllmOTLPService, vllmLoRARuntime, nixlHost, nixlPort, nixlNIC}, compileCaches, gangEnv),
		KeyEnv:       "VLLM_API_KEY",
		HealthPath:   "/health",
		ModelsPath:   "/v1/models",
		LoRALoadPath: "/v1/load_lora_adapter", LoRAUnloadPath: "/v1/unload_lora_adapter", LoRARequest: LoRAByName,
		MetricsPath: "/metrics",
		Metrics:     vllmMetrics(),
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
	}
}

// vllmMetrics are vLLM's series, which the fake engine exports too.
func vllmMetrics() Metrics {
	return Metrics{
		Running:              "vllm:num_requests_running",
		Waiting:              "vllm:num_requests_waiting",
		KVCacheUsage:         "vllm:kv_cache_usage_perc",
		KVCacheUsageFallback: "vllm:gpu_cache_usage_perc",
		PromptTokens:         "vllm:prompt_tokens_total",
		GenerationTokens:     "vllm:generation_tokens_total",
		PrefixCacheHits:      "vllm:prefix_cache_hits_total",
		PrefixCacheQueries:   "vllm:prefix_cache_queries_total",
		ModelLabel:           "model_name",
		LoRAInfo:             "vllm:lora_requests_info",
	}
}
