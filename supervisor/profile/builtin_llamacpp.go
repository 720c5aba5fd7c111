package profile

import (
	"strconv"
	"time"
)

// llama.cpp's defaults for what a deployment leaves unset. Unset, the
// engine itself would take the model's whole training context (-c 0 is
// "loaded from model", common/arg.cpp) split over auto slots (-np -1: 4
// slots sharing one unified KV buffer, tools/server/server.cpp), and with
// --fit on grow or shrink that context to the GPU's free memory: neither
// bounded by a share. llmgw passes figures instead. 4 slots is llama.cpp's
// own auto count; 4096 tokens a slot is the floor its --fit keeps
// (--fit-ctx, default 4096) and its former -c default. gpu_memory: auto
// always stores both figures (max_model_len and the chosen max_num_seqs),
// so these only serve an explicit gpu_memory, or none, without them.
const (
	llamacppDefaultSeqs   = 4
	llamacppDefaultSeqLen = 4096
)

// Mul is a×b, for a template that needs a product: llama.cpp's -c is
// max_model_len × max_num_seqs (see llamacppProfile). text/template has
// no arithmetic, and a method on Data is available to every profile,
// built-in or loaded from a file.
func (Data) Mul(a, b int) int { return a * b }

// llamacppProfile is the profile of llama.cpp's llama-server, pinned at
// build b11206 (PinnedLlamaCppImage). What each flag means there was read
// from common/arg.cpp, tools/server/README.md, tools/server/server.cpp and
// src/llama-context.cpp (see each flag below); the file index holds those
// files at untagged commits around that build, and the -np/-c/--kv-unified
// behaviour was measured on build b10481 (n_ctx_slot = c/np with -np
// given).
func llamacppProfile() Profile {
	return Profile{
		Name: "llamacpp",
		// The CUDA build, by tag and digest (pinned.go): the plain
		// server tag is CPU-only and would ignore --n-gpu-layers on a
		// GPU node without saying so.
		Image: PinnedLlamaCppImage,
		// The model is a GGUF file path (under the weights dir). The
		// image's binary is not on PATH, hence the absolute path. Its
		// parser takes "--flag value" as two elements (common_params_
		// parse_ex), hence no --flag=value here.
		Command: []string{
			"/app/llama-server",
			"--model", "{{.Model}}",
			"--alias", "{{.ServedName}}",
			"--host", "{{.Host}}",
			"--port", "{{.Port}}",
			// Concurrency and context. -c is the WHOLE KV context, split
			// over the -np slots: without a unified KV each slot gets
			// n_ctx_seq = n_ctx / n_seq_max, rounded up to a multiple of
			// 256 (src/llama-context.cpp), so -c = max_model_len ×
			// max_num_seqs gives every slot max_model_len. -np is always
			// given, so the server never takes its auto path (-np -1),
			// which forces a unified KV whatever the flags say
			// (server.cpp: n_parallel < 0 → 4 and kv_unified = true).
			"-np", "{{or .MaxNumSeqs " + strconv.Itoa(llamacppDefaultSeqs) + "}}",
			"-c", "{{.Mul (or .MaxModelLen " + strconv.Itoa(llamacppDefaultSeqLen) + ") (or .MaxNumSeqs " + strconv.Itoa(llamacppDefaultSeqs) + ")}}",
			// The KV layout, named: one KV stream per slot (-no-kvu,
			// --no-kv-unified; "-kvu, --kv-unified ... default: enabled
			// if number of slots is auto"). A unified buffer would let
			// one request grow to the whole -c, past max_model_len.
			"--no-kv-unified",
			// Memory: llama.cpp has no fraction flag. Its --fit (default
			// on: "-fit, --fit [on|off] whether to adjust unset arguments
			// to fit in device memory") sizes the context and the GPU
			// layers from the memory FREE at start, less a 1 GiB margin
			// (--fit-target), so a share next to idle neighbours grows
			// into their memory. Off, the engine allocates exactly the
			// weights of the layers offloaded, the KV of -c and its
			// compute buffers, which is what placement sized the share
			// for; when that does not fit, the load fails (an
			// allocation error) rather than shrinking silently.
			"--fit", "off",
			// Every layer on the GPU (a number above any model's layer
			// count; every build takes a number, later ones also "all").
			// With --fit off nothing moves a layer back to the CPU.
			"--n-gpu-layers", "999",
			// With TP GPUs: layers and their KV split over them
			// (--split-mode layer, the default, named), in equal parts.
			// Without --tensor-split llama.cpp splits by each GPU's FREE
			// memory at load (src/llama-model.cpp load_tensors: "default
			// split, by free memory"), so a GPU shared with a neighbour
			// would get fewer layers and an emptier one more than its
			// share; placement gives each GPU of the shard the same.
			"{{if gt .TP 1}}--split-mode{{end}}", "{{if gt .TP 1}}layer{{end}}",
			"{{if gt .TP 1}}--tensor-split{{end}}", "{{if gt .TP 1}}{{range $i := .TP}}{{if $i}},{{end}}1{{end}}{{end}}",
			// --cache-ram (the prompt cache, default 8192 MiB) is host
			// memory, not GPU memory: left at its default.
			"--metrics",
			// LoRA adapters are loaded at start only: every adapter's
			// file, comma-separated ("use comma-separated values to load
			// multiple adapters", common/arg.cpp), none applied until a
			// request asks for it by id (--lora-init-without-apply).
			"{{if .LoraPaths}}--lora{{end}}", "{{.LoraPaths}}",
			"{{if .LoraPaths}}--lora-init-without-apply{{end}}",
		},
		// With a key llama.cpp guards /metrics too, so the load
		// scrape sends it.
		KeyEnv: "LLAMA_API_KEY",
		// Adapters are loaded at start, and a request turns one on by
		// its index (parse_lora_request, tools/server).
		LoRARequest: LoRAByIndex,
		HealthPath:  "/health",
		ModelsPath:  "/v1/models",
		MetricsPath: "/metrics",
		// llama-server's series, all prefixed "llamacpp:" by
		// server_task_result_metrics::to_metrics (tools/server/
		// server-task.cpp): counters prompt_tokens_total and
		// tokens_predicted_total, gauges requests_processing and
		// requests_deferred. No KV-cache gauge: kv_cache_usage_ratio and
		// kv_cache_tokens were removed (llama.cpp PR #13660) and nothing
		// replaced them (n_tokens_max is a high watermark of one
		// sequence, not occupancy), so KVCacheUsage stays empty: unknown,
		// never a 0 % that would draw traffic.
		Metrics: Metrics{
			Running:          "llamacpp:requests_processing",
			Waiting:          "llamacpp:requests_deferred",
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
