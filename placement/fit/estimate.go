package fit

import (
	"errors"
	"fmt"
	"strings"
)

const gib = 1 << 30

// Model is a model as read from its files.
type Model struct {
	// Name is where it came from: a directory, a file or a hub id.
	Name string `json:"name"`
	// Format is "safetensors" or "gguf".
	Format  string   `json:"format"`
	Config  Config   `json:"config"`
	Tensors []Tensor `json:"tensors"`
}

// Profile is what a model needs independent of how it is served.
type Profile struct {
	Model   string  `json:"model"`
	Format  string  `json:"format"`
	Config  Config  `json:"-"`
	Weights Weights `json:"weights"`
	// Attention is "mha", "gqa" or "mla".
	Attention string `json:"attention"`
	// KVBytesPerToken is what one token costs in the KV cache of the
	// full-attention layers, summed over the whole model (all GPUs).
	KVBytesPerToken uint64 `json:"kv_bytes_per_token"`
	// SlidingKVBytesPerToken is the same for the sliding-window layers,
	// which hold at most SlidingWindow tokens of each sequence.
	SlidingKVBytesPerToken uint64 `json:"sliding_kv_bytes_per_token,omitempty"`
	SlidingWindow          int    `json:"sliding_window,omitempty"`
	kvElemBytes            uint64
}

// Analyze sizes a model's weights and KV cache. kvDType is the engine's KV
// cache dtype ("" or "auto": the model's own dtype). A model whose attention
// this package cannot size is refused with the reason.
func Analyze(m Model, kvDType string) (Profile, error) {
	c := m.Config
	if c.Unsupported != "" {
		return Profile{}, errors.New(c.Unsupported)
	}
	if err := c.check(); err != nil {
		return Profile{}, err
	}
	if len(m.Tensors) == 0 {
		return Profile{}, errors.New("no tensors: the model's headers list none")
	}
	w, err := SumWeights(m.Tensors, c.QuantBits)
	if err != nil {
		return Profile{}, err
	}
	modelDType := c.DType
	if m.Format == "gguf" {
		modelDType = "float16" // llama.cpp's KV cache is f16 unless told otherwise
	}
	eb, err := kvDTypeBytes(kvDType, modelDType)
	if err != nil {
		return Profile{}, err
	}
	p := Profile{Model: m.Name, Format: m.Format, Config: c, Weights: w, kvElemBytes: eb}
	perLayer := p.layerTokenBytes(1)
	switch {
	case c.KVLoRARank > 0:
		p.Attention = "mla"
	case c.kvHeads() < c.NumHeads:
		p.Attention = "gqa"
	default:
		p.Attention = "mha"
	}
	for _, k := range p.kinds() {
		if k == "sliding_attention" {
			p.SlidingKVBytesPerToken += perLayer
		} else {
			p.KVBytesPerToken += perLayer
		}
	}
	if p.SlidingKVBytesPerToken > 0 {
		p.SlidingWindow = c.SlidingWindow
	}
	return p, nil
}

// kinds is one entry per layer, every layer full attention when the config
// said nothing.
func (p Profile) kinds() []string {
	if len(p.Config.LayerKinds) == p.Config.NumLayers {
		return p.Config.LayerKinds
	}
	k := make([]string, p.Config.NumLayers)
	for i := range k {
		k[i] = "full_attention"
	}
	return k
}

// layerTokenBytes is one token's KV bytes in one layer on one of tp GPUs.
// Keys and values are split by KV head; with more GPUs than KV heads each
// GPU keeps a copy of one head, as vLLM replicates them. MLA's latent is
// not split: every GPU keeps all of it.
func (p Profile) layerTokenBytes(tp int) uint64 {
	c := p.Config
	if c.KVLoRARank > 0 {
		return uint64(c.KVLoRARank+c.QKRopeHeadDim) * p.kvElemBytes
	}
	heads := max(c.kvHeads()/tp, 1)
	return 2 * uint64(heads) * uint64(c.headDim()) * p.kvElemBytes
}

// Request is how a model is to be served.
type Request struct {
	TensorParallel   int    `json:"tensor_parallel"`
	PipelineParallel int    `json:"pipeline_parallel"`
	MaxModelLen      int    `json:"max_model_len"`
	MaxNumSeqs       int    `json:"max_num_seqs"`
	Engine           string `json:"engine"`
	// MaxLoras and MaxLoraRank size the LoRA buffers the engine
	// allocates at start (0: LoRA off; rank 0 is vLLM's default, 16).
	MaxLoras    int `json:"max_loras,omitempty"`
	MaxLoraRank int `json:"max_lora_rank,omitempty"`
}

// withDefaults fills what is unset: TP and PP 1, the model's own context,
// one sequence, vLLM.
func (r Request) withDefaults(p Profile) Request {
	r.TensorParallel = max(r.TensorParallel, 1)
	r.PipelineParallel = max(r.PipelineParallel, 1)
	r.MaxNumSeqs = max(r.MaxNumSeqs, 1)
	if r.MaxModelLen <= 0 {
		r.MaxModelLen = p.Config.MaxContext
	}
	if r.Engine == "" {
		r.Engine = "vllm"
	}
	return r
}

// Breakdown is the memory one GPU needs, term by term.
type Breakdown struct {
	Weights     uint64 `json:"weights_bytes"`
	KVCache     uint64 `json:"kv_cache_bytes"`
	Framework   uint64 `json:"framework_bytes"`
	Activations uint64 `json:"activations_bytes"`
	CUDAGraphs  uint64 `json:"cuda_graphs_bytes"`
	// LoRA is the adapters' GPU slots (loraPerGPU); LoRACPU, which is
	// host memory and not in Total, vLLM's CPU cache of as many adapters
	// (max_cpu_loras defaults to max_loras).
	LoRA    uint64 `json:"lora_bytes,omitempty"`
	LoRACPU uint64 `json:"lora_cpu_bytes,omitempty"`
	Total   uint64 `json:"total_bytes"`
}

// Estimate is a profile served one way.
type Estimate struct {
	Profile
	Request Request   `json:"request"`
	PerGPU  Breakdown `json:"per_gpu"`
}

// Estimate computes the per-GPU figure for r. The split must divide the
// attention heads, and the KV heads or be a multiple of them; pipeline
// stages must not outnumber layers.
func (p Profile) Estimate(r Request) (Estimate, error) {
	r = r.withDefaults(p)
	c := p.Config
	tp, pp := r.TensorParallel, r.PipelineParallel
	if err := p.CheckSplit(tp, pp); err != nil {
		return Estimate{}, err
	}
	if r.MaxModelLen <= 0 {
		return Estimate{}, errors.New("max_model_len: the model's config names no max_position_embeddings; give max_model_len")
	}
	if c.MaxContext > 0 && r.MaxModelLen > c.MaxContext {
		return Estimate{}, fmt.Errorf("max_model_len %d is longer than the model's max_position_embeddings %d", r.MaxModelLen, c.MaxContext)
	}
	if r.MaxNumSeqs > 1<<16 || r.MaxModelLen > 1<<26 {
		return Estimate{}, fmt.Errorf("max_num_seqs %d or max_model_len %d is beyond any GPU", r.MaxNumSeqs, r.MaxModelLen)
	}
	b := Breakdown{
		Weights: p.weightsPerGPU(tp, pp),
		KVCache: p.kvPerGPU(tp, pp, r.MaxModelLen, r.MaxNumSeqs),
	}
	b.Framework, b.Activations, b.CUDAGraphs = overhead(p, r)
	if r.MaxLoras > 0 && !strings.EqualFold(r.Engine, "llamacpp") {
		b.LoRA, b.LoRACPU = p.loraBytes(r)
	}
	b.Total = b.Weights + b.KVCache + b.Framework + b.Activations + b.CUDAGraphs + b.LoRA
	return Estimate{Profile: p, Request: r, PerGPU: b}, nil
}

// CheckSplit refuses a tensor or pipeline split the engine would refuse.
func (p Profile) CheckSplit(tp, pp int) error {
	c := p.Config
	if tp < 1 || tp > 64 || pp < 1 || pp > 64 {
		return fmt.Errorf("tensor_parallel %d, pipeline_parallel %d: want 1 to 64 each", tp, pp)
	}
	if c.NumHeads%tp != 0 {
		return fmt.Errorf("tensor_parallel %d does not divide the %d attention heads", tp, c.NumHeads)
	}
	if kv := c.kvHeads(); c.KVLoRARank == 0 && kv%tp != 0 && tp%kv != 0 {
		return fmt.Errorf("tensor_parallel %d neither divides nor is a multiple of the %d KV heads", tp, kv)
	}
	if pp > c.NumLayers {
		return fmt.Errorf("pipeline_parallel %d is more stages than the %d layers", pp, c.NumLayers)
	}
	return nil
}

// stageLayers is how many layers the largest pipeline stage holds.
func stageLayers(layers, pp int) int { return (layers + pp - 1) / pp }

// weightsPerGPU is the largest share one GPU holds: the numbered layers
// split by stage, then by tensor parallelism; the embeddings and output head
// counted whole on the stage that has them (conservative: with pp > 1 they
// sit on different stages).
func (p Profile) weightsPerGPU(tp, pp int) uint64 {
	w := p.Weights
	layers := uint64(p.Config.NumLayers)
	layerShare := ceilDiv(w.LayerBytes*uint64(stageLayers(p.Config.NumLayers, pp)), layers)
	return ceilDiv(layerShare+(w.Bytes-w.LayerBytes), uint64(tp))
}

// kvPerGPU is the KV cache of seqs sequences of ctx tokens on the GPU of
// the largest stage.
func (p Profile) kvPerGPU(tp, pp, ctx, seqs int) uint64 {
	kinds := p.kinds()
	per := p.layerTokenBytes(tp)
	n := stageLayers(len(kinds), pp)
	var most uint64
	for start := 0; start < len(kinds); start += n {
		var tokens uint64
		for _, k := range kinds[start:min(start+n, len(kinds))] {
			if k == "sliding_attention" && p.Config.SlidingWindow > 0 {
				tokens += uint64(min(ctx, p.Config.SlidingWindow))
			} else {
				tokens += uint64(ctx)
			}
		}
		most = max(most, tokens*per)
	}
	return most * uint64(seqs)
}

// Overhead constants, from vLLM's start-up logs (see docs/architecture.md):
//
//   - Meta-Llama-3-8B on one H100 logged 1.79 GiB of non-torch memory and
//     1.26 GiB of activation peak, and 3.58 GiB non-torch at TP 2
//     (vllm-project/vllm#10511, v0.6);
//   - Llama-3.1-8B-Instruct on an L40S logged 14.99 GiB of weights and a
//     KV cache of 158,656 tokens (19.4 GiB at 128 KiB a token) under the
//     default 0.9 of its memory (vllm-project/vllm#17122, v0.8 V1): about
//     5.7 GiB beside weights and KV if torch sees 44.5 GiB of the card;
//   - CUDA graphs took 0.21 GiB for Llama-3.2-1B (vllm-project/vllm#11349),
//     and older releases warned of 1-3 GiB.
//
// The framework term is set near the top of that range: a figure short of
// what the engine keeps leaves it a KV cache smaller than the context it
// was given, and vLLM then refuses to start.
const (
	frameworkBytes     = 3 * gib // CUDA context, workspaces, allocator slack
	ncclBytes          = 2 * gib // NCCL and custom all-reduce buffers when split
	cudaGraphBytes     = gib / 2
	batchTokens        = 8192 // vLLM's default max_num_batched_tokens for serving
	llamaCppFramework  = gib / 2
	llamaCppBatch      = 512 // llama.cpp's default micro-batch
	activationHeadroom = 3   // over 2: temporaries beside the widest tensors
)

// overhead is the engine's memory beside weights and KV cache.
func overhead(p Profile, r Request) (framework, activations, graphs uint64) {
	c := p.Config
	tp := uint64(r.TensorParallel)
	inter := uint64(c.IntermediateSize)
	if c.ExpertsPerToken > 0 {
		if c.MoEIntermediate > 0 {
			inter = uint64(c.MoEIntermediate)
		}
		inter *= uint64(c.ExpertsPerToken)
	}
	h, hd := uint64(c.HiddenSize), uint64(c.headDim())
	qkv := uint64(c.NumHeads+2*c.kvHeads()) * hd
	logits := uint64(r.MaxNumSeqs) * uint64(c.VocabSize) * 4 * 2 // fp32 logits and probabilities
	switch strings.ToLower(r.Engine) {
	case "llamacpp":
		// llama.cpp's compute buffer: one micro-batch through the widest
		// layer and the output head, in f32.
		act := uint64(llamaCppBatch) * (uint64(c.VocabSize) + 4*h + 2*inter) * 4
		return llamaCppFramework, act, 0
	}
	framework = frameworkBytes
	if r.TensorParallel*r.PipelineParallel > 1 {
		framework += ncclBytes
	}
	// One forward pass over the batch: the fused gate/up output, the QKV
	// projection and a few hidden-sized buffers, in 16 bits, with headroom.
	width := 2*inter/tp + 4*h + qkv/tp
	activations = batchTokens*width*2*activationHeadroom/2 + logits
	return framework, activations, cudaGraphBytes
}

func ceilDiv(a, b uint64) uint64 { return (a + b - 1) / b }

// loraBytes is what LoRA costs: per GPU, the slots vLLM allocates at
// start for max_loras adapters of max_lora_rank on every LoRA-capable
// module of the stage's layers (create_lora_weights in vllm/lora/layers:
// each slot holds A, rank × in, and B, out × rank, per module); on the
// host, its CPU cache of as many adapters, whole.
//
// The modules are a transformer's: q, k, v, o and the MLP's gate, up and
// down (each expert's, for a mixture of experts). With tensor
// parallelism vLLM shards half of each pair by default
// (fully_sharded_loras off): a column-parallel module (q, k, v, gate, up)
// keeps A whole and B split ("LoRA B is sliced for tensor parallelism",
// ColumnParallelLinearWithLoRA in vllm/lora/layers, whose
// create_lora_weights sizes A by the whole input and B by the output
// partition), a row-parallel one (o, down) A split and B whole. The dtype is the model's (lora_dtype auto), 2 bytes unless the
// model is in 32-bit floats.
func (p Profile) loraBytes(r Request) (perGPU, cpu uint64) {
	c := p.Config
	rank := uint64(r.MaxLoraRank)
	if rank == 0 {
		rank = 16
	}
	tp := uint64(r.TensorParallel)
	h, hd := uint64(c.HiddenSize), uint64(c.headDim())
	q, kv := uint64(c.NumHeads)*hd, uint64(c.kvHeads())*hd
	inter, mlps := uint64(c.IntermediateSize), uint64(1)
	if c.Experts > 0 {
		if c.MoEIntermediate > 0 {
			inter = uint64(c.MoEIntermediate)
		}
		mlps = uint64(c.Experts)
	}
	type module struct{ in, out, n uint64 }
	col := []module{{h, q, 1}, {h, kv, 1}, {h, kv, 1}, {h, inter, mlps}, {h, inter, mlps}}
	row := []module{{q, h, 1}, {inter, h, mlps}}
	var sharded, whole uint64 // elements per slot and layer
	for _, m := range col {
		sharded += m.n * (m.in + ceilDiv(m.out, tp))
		whole += m.n * (m.in + m.out)
	}
	for _, m := range row {
		sharded += m.n * (ceilDiv(m.in, tp) + m.out)
		whole += m.n * (m.in + m.out)
	}
	elem := uint64(2)
	if strings.Contains(strings.ToLower(c.DType), "float32") {
		elem = 4
	}
	slots := uint64(r.MaxLoras)
	layers := uint64(stageLayers(c.NumLayers, r.PipelineParallel))
	return slots * rank * sharded * layers * elem, slots * rank * whole * uint64(c.NumLayers) * elem
}
