// Package fittest holds the real shapes of public model families, as
// config.json text and header tensor lists (no weights), for tests of the
// estimate and of the header readers. Shapes follow each family's published
// config.json and checkpoint layout.
package fittest

import (
	"fmt"

	"github.com/llmgw/llmgw/placement/fit"
)

// Family is one model as its files describe it.
type Family struct {
	// Dir is a directory name for it (the hub id with "/" as "--").
	Dir string
	// Config is its config.json.
	Config string
	// Tensors is its safetensors header (or GGUF tensor list).
	Tensors []fit.Tensor
	// GGUF, for a GGUF family, is the metadata a header carries.
	GGUF map[string]any
	// Params, WeightsBytes and KVBytesPerToken are the published figures
	// (parameter count, checkpoint size) and the KV cost a test expects.
	Params          uint64
	WeightsBytes    uint64
	KVBytesPerToken uint64
}

type builder struct{ ts []fit.Tensor }

func (b *builder) add(name, dtype string, shape ...uint64) {
	b.ts = append(b.ts, fit.Tensor{Name: name, DType: dtype, Shape: shape})
}

// linear adds a projection of out×in weights in dtype, with the scales the
// quantisation scheme stores beside it.
func (b *builder) linear(name, scheme string, out, in uint64) {
	switch scheme {
	case "fp8": // compressed-tensors FP8, per-tensor scales
		b.add(name+".weight", "F8_E4M3", out, in)
		b.add(name+".weight_scale", "F32")
		b.add(name+".input_scale", "F32")
	case "awq": // AutoAWQ GEMM: int4 packed eight to an int32, groups of 128
		b.add(name+".qweight", "I32", in, out/8)
		b.add(name+".qzeros", "I32", in/128, out/8)
		b.add(name+".scales", "F16", in/128, out)
	default:
		b.add(name+".weight", scheme, out, in)
	}
}

// llamaLike is the Llama layout: q/k/v/o, gate/up/down, two norms a layer.
func llamaLike(layers, hidden, inter, heads, kv, headDim, vocab uint64, scheme, embedDType string, tied bool, qkvBias bool) []fit.Tensor {
	var b builder
	b.add("model.embed_tokens.weight", embedDType, vocab, hidden)
	for i := range layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		b.linear(p+"self_attn.q_proj", scheme, heads*headDim, hidden)
		b.linear(p+"self_attn.k_proj", scheme, kv*headDim, hidden)
		b.linear(p+"self_attn.v_proj", scheme, kv*headDim, hidden)
		if qkvBias {
			b.add(p+"self_attn.q_proj.bias", embedDType, heads*headDim)
			b.add(p+"self_attn.k_proj.bias", embedDType, kv*headDim)
			b.add(p+"self_attn.v_proj.bias", embedDType, kv*headDim)
		}
		b.linear(p+"self_attn.o_proj", scheme, hidden, heads*headDim)
		b.linear(p+"mlp.gate_proj", scheme, inter, hidden)
		b.linear(p+"mlp.up_proj", scheme, inter, hidden)
		b.linear(p+"mlp.down_proj", scheme, hidden, inter)
		b.add(p+"input_layernorm.weight", embedDType, hidden)
		b.add(p+"post_attention_layernorm.weight", embedDType, hidden)
	}
	b.add("model.norm.weight", embedDType, hidden)
	if !tied {
		b.add("lm_head.weight", embedDType, vocab, hidden)
	}
	return b.ts
}

const llama31Config = `{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
  "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
  "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
  "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "tie_word_embeddings": false,
  "rope_scaling": {"factor": 8.0, "rope_type": "llama3"}%s
}`

// Llama31_8B is meta-llama/Llama-3.1-8B: dense, grouped-query attention (32
// query heads, 8 KV heads of 128), bf16. Published: 8.03 B parameters,
// 16.06 GB; KV 2 × 32 layers × 8 heads × 128 × 2 bytes = 128 KiB a token.
func Llama31_8B() Family {
	return Family{
		Dir:             "meta-llama--Llama-3.1-8B",
		Config:          fmt.Sprintf(llama31Config, ""),
		Tensors:         llamaLike(32, 4096, 14336, 32, 8, 128, 128256, "BF16", "BF16", false, false),
		Params:          8_030_261_248,
		WeightsBytes:    16_060_522_496,
		KVBytesPerToken: 128 << 10,
	}
}

// Llama31_8B_FP8 is the FP8 (compressed-tensors, per-tensor scales)
// checkpoint of Llama-3.1-8B-Instruct: every linear layer F8_E4M3,
// embeddings and head bf16. Published size about 9.08 GB.
func Llama31_8B_FP8() Family {
	q := `, "quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized"}`
	return Family{
		Dir:             "neuralmagic--Meta-Llama-3.1-8B-Instruct-FP8",
		Config:          fmt.Sprintf(llama31Config, q),
		Tensors:         llamaLike(32, 4096, 14336, 32, 8, 128, 128256, "fp8", "BF16", false, false),
		Params:          8_030_261_248,
		WeightsBytes:    9_081_202_432,
		KVBytesPerToken: 128 << 10,
	}
}

// Qwen25_7B_AWQ is Qwen/Qwen2.5-7B-Instruct-AWQ: int4 weights in groups of
// 128 (AutoAWQ GEMM), fp16 embeddings, head and q/k/v biases; 28 heads, 4
// KV heads. vLLM logs "Loading model weights took 5.2032 GB" for it (that
// figure is GiB).
func Qwen25_7B_AWQ() Family {
	return Family{
		Dir: "Qwen--Qwen2.5-7B-Instruct-AWQ",
		Config: `{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
  "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
  "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
  "sliding_window": 131072, "use_sliding_window": false, "max_window_layers": 28,
  "torch_dtype": "float16", "tie_word_embeddings": false,
  "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"}}`,
		Tensors:         llamaLike(28, 3584, 18944, 28, 4, 128, 152064, "awq", "F16", false, true),
		Params:          7_615_616_512,
		WeightsBytes:    5_586_908_700, // vLLM's 5.2032 GiB
		KVBytesPerToken: 2 * 28 * 4 * 128 * 2,
	}
}

// Gemma2_9B is google/gemma-2-9b: 42 layers alternating sliding-window
// (4096 tokens, even layers) and global attention, 16 heads, 8 KV heads of
// 256, tied embeddings. Published: 9.24 B parameters.
func Gemma2_9B() Family {
	var b builder
	const hidden, inter, layers = 3584, 14336, 42
	b.add("model.embed_tokens.weight", "BF16", 256000, hidden)
	for i := range layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		b.add(p+"self_attn.q_proj.weight", "BF16", 16*256, hidden)
		b.add(p+"self_attn.k_proj.weight", "BF16", 8*256, hidden)
		b.add(p+"self_attn.v_proj.weight", "BF16", 8*256, hidden)
		b.add(p+"self_attn.o_proj.weight", "BF16", hidden, 16*256)
		b.add(p+"mlp.gate_proj.weight", "BF16", inter, hidden)
		b.add(p+"mlp.up_proj.weight", "BF16", inter, hidden)
		b.add(p+"mlp.down_proj.weight", "BF16", hidden, inter)
		for _, n := range []string{"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"} {
			b.add(p+n+".weight", "BF16", hidden)
		}
	}
	b.add("model.norm.weight", "BF16", hidden)
	return Family{
		Dir: "google--gemma-2-9b",
		Config: `{"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584,
  "intermediate_size": 14336, "num_hidden_layers": 42, "num_attention_heads": 16,
  "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
  "sliding_window": 4096, "query_pre_attn_scalar": 256, "torch_dtype": "bfloat16"}`,
		Tensors:      b.ts,
		Params:       9_241_705_984,
		WeightsBytes: 18_483_411_968,
		// Global layers only; the 21 sliding ones cost the same per token
		// up to their window.
		KVBytesPerToken: 2 * 21 * 8 * 256 * 2,
	}
}

// Mixtral8x7B is mistralai/Mixtral-8x7B-v0.1: 8 experts, 2 a token, 32
// layers, 32 heads, 8 KV heads. Published: 46.7 B parameters.
func Mixtral8x7B() Family {
	var b builder
	const hidden, inter, layers, vocab = 4096, 14336, 32, 32000
	b.add("model.embed_tokens.weight", "BF16", vocab, hidden)
	for i := range layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		b.add(p+"self_attn.q_proj.weight", "BF16", 4096, hidden)
		b.add(p+"self_attn.k_proj.weight", "BF16", 1024, hidden)
		b.add(p+"self_attn.v_proj.weight", "BF16", 1024, hidden)
		b.add(p+"self_attn.o_proj.weight", "BF16", hidden, 4096)
		b.add(p+"block_sparse_moe.gate.weight", "BF16", 8, hidden)
		for e := range 8 {
			q := fmt.Sprintf("%sblock_sparse_moe.experts.%d.", p, e)
			b.add(q+"w1.weight", "BF16", inter, hidden)
			b.add(q+"w2.weight", "BF16", hidden, inter)
			b.add(q+"w3.weight", "BF16", inter, hidden)
		}
		b.add(p+"input_layernorm.weight", "BF16", hidden)
		b.add(p+"post_attention_layernorm.weight", "BF16", hidden)
	}
	b.add("model.norm.weight", "BF16", hidden)
	b.add("lm_head.weight", "BF16", vocab, hidden)
	return Family{
		Dir: "mistralai--Mixtral-8x7B-v0.1",
		Config: `{"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
  "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
  "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
  "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": null, "torch_dtype": "bfloat16"}`,
		Tensors:         b.ts,
		Params:          46_702_792_704,
		WeightsBytes:    93_405_585_408,
		KVBytesPerToken: 2 * 32 * 8 * 128 * 2,
	}
}

// Llama31_8B_Q4KM is a GGUF of Llama-3.1-8B quantised as llama.cpp's Q4_K_M
// does it: Q4_K for most projections, Q6_K for the output head and for
// attn_v and ffn_down (llama.cpp gives Q6_K to half of those layers and
// Q4_K to the rest; here the first 16 layers get Q6_K), F32 norms. GGUF
// lists dims innermost first.
func Llama31_8B_Q4KM() Family {
	var b builder
	const hidden, inter, vocab = 4096, 14336, 128256
	b.add("token_embd.weight", "Q4_K", hidden, vocab)
	for i := range 32 {
		p := fmt.Sprintf("blk.%d.", i)
		hi := "Q4_K"
		if i < 16 {
			hi = "Q6_K"
		}
		b.add(p+"attn_q.weight", "Q4_K", hidden, 4096)
		b.add(p+"attn_k.weight", "Q4_K", hidden, 1024)
		b.add(p+"attn_v.weight", hi, hidden, 1024)
		b.add(p+"attn_output.weight", "Q4_K", 4096, hidden)
		b.add(p+"ffn_gate.weight", "Q4_K", hidden, inter)
		b.add(p+"ffn_up.weight", "Q4_K", hidden, inter)
		b.add(p+"ffn_down.weight", hi, inter, hidden)
		b.add(p+"attn_norm.weight", "F32", hidden)
		b.add(p+"ffn_norm.weight", "F32", hidden)
	}
	b.add("output_norm.weight", "F32", hidden)
	b.add("output.weight", "Q6_K", hidden, vocab)
	b.add("rope_freqs.weight", "F32", 64)
	return Family{
		Dir: "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
		GGUF: map[string]any{
			"general.architecture":               "llama",
			"general.name":                       "Meta Llama 3.1 8B Instruct",
			"llama.block_count":                  uint32(32),
			"llama.context_length":               uint32(131072),
			"llama.embedding_length":             uint32(4096),
			"llama.feed_forward_length":          uint32(14336),
			"llama.attention.head_count":         uint32(32),
			"llama.attention.head_count_kv":      uint32(8),
			"llama.rope.dimension_count":         uint32(128),
			"llama.vocab_size":                   uint32(128256),
			"general.file_type":                  uint32(15),
			"tokenizer.ggml.model":               "gpt2",
			"llama.attention.layer_norm_rms_eps": float32(1e-5),
		},
		Tensors:      b.ts,
		Params:       8_030_261_312,
		WeightsBytes: 4_920_739_232, // the published file
		// llama.cpp keeps an f16 KV cache by default.
		KVBytesPerToken: 128 << 10,
	}
}
