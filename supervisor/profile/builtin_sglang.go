package profile

import (
	"slices"
	"time"
)

// Optional flags: see the const block of builtin.go for why each is one
// element.
const (
	// The fraction is of free memory and covers weights and KV only
	// (Profile.MemoryFraction FractionOfFreeStatic, sglangFraction).
	sglangMem = "{{if .GPUMemoryUtilization}}--mem-fraction-static={{.GPUMemoryUtilization}}{{end}}"
	sglangLen = "{{if .MaxModelLen}}--context-length={{.MaxModelLen}}{{end}}"
	// A concurrency cap only when the user gave one (see vllmSeqs).
	sglangSeqs = "{{if .MaxNumSeqsGiven}}--max-running-requests={{.MaxNumSeqs}}{{end}}"
	// SGLang reads its key from no environment variable (see
	// Profile.KeyEnv), so it goes in the YAML file that --config names
	// (sglangConfig), out of the command line every local user can read.
	// SGLang's ConfigArgumentMerger (python/sglang/srt/
	// server_args_config_parser.py) finds the file only as the element
	// after an exact "--config" (not --config=FILE), demands a .yaml or
	// .yml name, and turns each key into --KEY VALUE. A runner that
	// writes no files (FilesDir empty) gets the key on the command line,
	// as before, rather than an engine without one.
	sglangConfigFlag = "{{if and .FilesDir .APIKey}}--config{{end}}"
	sglangConfigPath = "{{if and .FilesDir .APIKey}}{{.FilesDir}}/" + sglangConfig + "{{end}}"
	sglangKeyArgv    = "{{if and (not .FilesDir) .APIKey}}--api-key={{.APIKey}}{{end}}"
	sglangConfig     = "sglang.yaml"
	// sglangCheapHealth makes SGLang's /health the cheap check instead of a
	// one-token generation (see the sglang profile's Readiness).
	sglangCheapHealth = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0"
)

// sglangProfile is the profile of SGLang.
func sglangProfile() Profile {
	return Profile{
		Name:  "sglang",
		Image: PinnedSGLangImage,
		Command: []string{
			"python3", "-m", "sglang.launch_server",
			"--model-path", "{{.Model}}",
			"--served-model-name", "{{.ServedName}}",
			// A gang is a pipeline across its nodes and tensor
			// parallel within each: with --nnodes N and --pp-size N
			// SGLang gives each node one pipeline stage of --tp-size
			// GPUs (nnodes_per_tp_group = nnodes // pp_size = 1 in
			// _launch_subprocesses, python/sglang/srt/entrypoints/engine.py), so only the
			// stages' activations cross the machine boundary, not
			// every layer's all-reduce. Every rank must launch alike, so
			// the layout follows the cluster version (3 brought it):
			// below it a gang keeps the one earlier agents render, TP
			// spanning every GPU of the gang.
			"--tp-size", "{{if or (eq .NNodes 1) (ge .ClusterVersion 3)}}{{.TP}}{{else}}{{.TPTotal}}{{end}}",
			"{{if and (gt .NNodes 1) (ge .ClusterVersion 3)}}--pp-size={{.PP}}{{end}}",
			"--host", "{{.Host}}",
			"--port", "{{.Port}}",
			// Without it SGLang serves no /metrics.
			"--enable-metrics",
			sglangMem,
			sglangLen,
			sglangSeqs,
			sglangConfigFlag,
			sglangConfigPath,
			sglangKeyArgv,
			gang("nnodes", "NNodes"),
			gang("node-rank", "NodeRank"),
			// HOST:PORT, an IPv6 host in brackets ("[fd00::1]:29500"),
			// the form SGLang needs for IPv6.
			gang("dist-init-addr", "MasterHostPort"),
			// LoRA, adapters loaded at runtime (/load_lora_adapter):
			// SGLang sizes its buffers from --max-lora-rank and
			// --lora-target-modules, which it needs when no adapter is
			// given at start (ServerArgs.check_lora_server_args,
			// python/sglang/srt/server_args.py); one batch holds
			// --max-loras-per-batch adapters.
			"{{if .MaxLoras}}--enable-lora{{end}}",
			"{{if .MaxLoras}}--max-loras-per-batch={{.MaxLoras}}{{end}}",
			"{{if .MaxLoras}}--max-lora-rank={{.MaxLoraRank}}{{end}}",
			"{{if .MaxLoras}}--lora-target-modules=all{{end}}",
			// Prefill/decode disaggregation (python/sglang/srt/
			// disaggregation): the role is a start flag, mooncake the
			// default backend, and a prefill serves its bootstrap port,
			// which the gateway names to the decode in each request.
			"{{if .Role}}--disaggregation-mode={{.Role}}{{end}}",
			`{{if .Role}}--disaggregation-transfer-backend={{or .TransferBackend "mooncake"}}{{end}}`,
			`{{if eq .Role "prefill"}}--disaggregation-bootstrap-port={{.KVPort}}{{end}}`,
			"{{if and .Role .NIC}}--disaggregation-ib-device={{.NIC}}{{end}}",
		},
		Files: map[string]string{
			sglangConfig: "{{if .APIKey}}api-key: {{yamlString .APIKey}}\n{{end}}",
		},
		MemoryFraction: FractionOfFreeStatic,
		Env:            slices.Concat([]string{hfHome, sglangCheapHealth}, compileCaches, gangEnv),
		HealthPath:     "/health",
		ModelsPath:     "/v1/models",
		LoRALoadPath:   "/load_lora_adapter", LoRAUnloadPath: "/unload_lora_adapter", LoRARequest: LoRABaseColon,
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
