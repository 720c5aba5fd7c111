// Package fit estimates the GPU memory a model needs from its own files:
// config.json and the tensor list of its safetensors or GGUF headers.
//
// It owns the arithmetic only. Reading files, directories, other nodes and
// the hub is probes/weights' job; this package takes what they parsed and
// never does I/O, reads a clock or starts a goroutine, so the node that
// accepts a place, the CLI and tests all get the same figure from the same
// inputs (a test in internal/deptest forbids I/O packages here).
//
// The per-GPU figure is the sum of terms that are each shown:
//
//	weights      the tensors' bytes by dtype (quantised formats by their
//	             block sizes), split by tensor and pipeline parallelism
//	kv cache     2 × full-attention layers × KV heads × head dim × KV dtype
//	             bytes per token (sliding-window layers capped at their
//	             window; MLA stores one latent per token and layer), for
//	             max_num_seqs sequences of max_model_len tokens
//	framework    CUDA context, cuBLAS and attention workspaces, the
//	             allocator's slack; NCCL buffers when the model is split
//	activations  the peak of one forward pass over the engine's batch of
//	             tokens, plus the sampler's logits
//	cuda graphs  the memory the captured decode graphs keep
//
// The overhead terms are calibrated against what vLLM's own start-up log
// reports (see Overhead); they are stated, not measured here.
package fit
