package profile

// The images the built-in profiles pin, by tag and digest: a tag alone is
// mutable, and flags, metrics and the CUDA build (so the driver an image
// needs) change between pulls (vLLM images after 0.20 are CUDA 13 builds
// that need driver 580 or later: vllm #42738). The flags each profile
// renders are checked against the pinned version's argument parser by
// golden_test.go, from the lists under testdata/flags/. Bumping an image
// means bumping its list and regenerating the golden files (see
// testdata/flags/README).
const (
	// vLLM 0.12.0: past 0.11.1, the first release with the multi-node
	// launch a gang uses (--nnodes, --node-rank, --master-addr, --headless;
	// vllm PR #23691), and before the CUDA 13 images. Its image is a CUDA
	// 12.9 build (torch 2.9.0+cu129): driver 575 or later.
	PinnedVLLMImage = "vllm/vllm-openai:v0.12.0@sha256:6766ce0c459e24b76f3e9ba14ffc0442131ef4248c904efdcbf0d89e38be01fe"
	// SGLang 0.5.9: --pp-size (pipeline stages across machines) and
	// --config (a YAML file of flags, so the key leaves argv). A CUDA 12.9
	// build: driver 575 or later.
	PinnedSGLangImage = "lmsysorg/sglang:v0.5.9@sha256:e216b7dc4ac1938b599b982233ccf7eb2b11dd1f07fc2e00a7b9841052c553be"
	// llama.cpp build b11206, the server's CUDA image (the plain server
	// tag is CPU-only). A CUDA 12.8 build: driver 570 or later.
	PinnedLlamaCppImage = "ghcr.io/ggml-org/llama.cpp:server-cuda-b11206@sha256:3e7673cce183a55f97a1bc3c80817f3c61452483c13bc088a6766388af4775fe"
)
