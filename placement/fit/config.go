package fit

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Config is what the estimate needs from a model's config.json (or, for a
// GGUF file, from its metadata).
type Config struct {
	ModelType        string `json:"model_type"`
	HiddenSize       int    `json:"hidden_size"`
	IntermediateSize int    `json:"intermediate_size"`
	NumLayers        int    `json:"num_hidden_layers"`
	NumHeads         int    `json:"num_attention_heads"`
	// NumKVHeads is the number of key/value heads (grouped-query
	// attention); 0 means as many as NumHeads.
	NumKVHeads int `json:"num_key_value_heads"`
	// HeadDim is 0 when config.json leaves it to hidden_size / heads.
	HeadDim    int `json:"head_dim"`
	VocabSize  int `json:"vocab_size"`
	MaxContext int `json:"max_position_embeddings"`
	// DType is torch_dtype (or dtype, as newer configs write it).
	DType string `json:"torch_dtype"`
	// LayerKinds is one entry per layer: "full_attention" or
	// "sliding_attention". Derived when config.json has no layer_types.
	LayerKinds    []string `json:"layer_types"`
	SlidingWindow int      `json:"sliding_window"`
	// KVLoRARank and QKRopeHeadDim describe multi-head latent attention
	// (DeepSeek-V2/V3): one latent of KVLoRARank + QKRopeHeadDim elements
	// per token and layer replaces the keys and values.
	KVLoRARank    int `json:"kv_lora_rank"`
	QKRopeHeadDim int `json:"qk_rope_head_dim"`
	// Experts and ExpertsPerToken are set for mixture-of-experts models;
	// MoEIntermediate is each expert's width where it differs from
	// IntermediateSize.
	Experts         int `json:"num_local_experts"`
	ExpertsPerToken int `json:"num_experts_per_tok"`
	MoEIntermediate int `json:"moe_intermediate_size"`
	// Quant is quantization_config.quant_method (awq, gptq, fp8,
	// compressed-tensors, ...), and QuantBits its weight bits.
	Quant     string `json:"quant_method,omitempty"`
	QuantBits int    `json:"quant_bits,omitempty"`
	// Unsupported, when set, names why the estimate refuses this model.
	Unsupported string `json:"unsupported,omitempty"`
}

// rawConfig is config.json as Hugging Face writes it, for the fields read.
type rawConfig struct {
	ModelType          string          `json:"model_type"`
	Architectures      []string        `json:"architectures"`
	HiddenSize         int             `json:"hidden_size"`
	IntermediateSize   int             `json:"intermediate_size"`
	NumLayers          int             `json:"num_hidden_layers"`
	NumHeads           int             `json:"num_attention_heads"`
	NumKVHeads         *int            `json:"num_key_value_heads"`
	HeadDim            int             `json:"head_dim"`
	VocabSize          int             `json:"vocab_size"`
	MaxPosition        int             `json:"max_position_embeddings"`
	TorchDType         string          `json:"torch_dtype"`
	DType              string          `json:"dtype"`
	LayerTypes         []string        `json:"layer_types"`
	SlidingWindow      *int            `json:"sliding_window"`
	UseSlidingWindow   *bool           `json:"use_sliding_window"`
	MaxWindowLayers    int             `json:"max_window_layers"`
	SlidingPattern     int             `json:"sliding_window_pattern"`
	KVLoRARank         int             `json:"kv_lora_rank"`
	QKRopeHeadDim      int             `json:"qk_rope_head_dim"`
	NumLocalExperts    int             `json:"num_local_experts"`
	NumExperts         int             `json:"num_experts"`
	NRoutedExperts     int             `json:"n_routed_experts"`
	ExpertsPerTok      int             `json:"num_experts_per_tok"`
	MoEIntermediate    int             `json:"moe_intermediate_size"`
	IsEncoderDecoder   bool            `json:"is_encoder_decoder"`
	QuantizationConfig *rawQuant       `json:"quantization_config"`
	TextConfig         json.RawMessage `json:"text_config"`
	AttentionChunkSize int             `json:"attention_chunk_size"`
	SSMStateSize       int             `json:"state_size"`
	HybridOverridePatt string          `json:"hybrid_override_pattern"`
	LinearNumKeyHeads  int             `json:"linear_num_key_heads"`
}

type rawQuant struct {
	QuantMethod string `json:"quant_method"`
	Bits        int    `json:"bits"`
	WBits       int    `json:"w_bit"`
}

// stateSpace names model types whose per-token state is not a KV cache (or
// only partly one): the estimate refuses them by name rather than guess.
var stateSpace = []string{
	"mamba", "mamba2", "falcon_mamba", "jamba", "zamba", "zamba2", "rwkv", "rwkv5", "rwkv6",
	"recurrent_gemma", "nemotron_h", "qwen3_next", "lfm2", "granitemoehybrid", "falcon_h1",
	"bamba", "plamo2", "minimax", "minimax_m1",
}

// ParseConfig reads a config.json. A multimodal config's text_config is
// what it reads, since the language model is what holds a KV cache. Missing
// required fields are errors naming the field.
func ParseConfig(data []byte) (Config, error) {
	var raw rawConfig
	if err := json.Unmarshal(data, &raw); err != nil {
		return Config{}, fmt.Errorf("not a JSON config: %w", err)
	}
	if len(raw.TextConfig) > 0 && string(raw.TextConfig) != "null" {
		var text rawConfig
		if err := json.Unmarshal(raw.TextConfig, &text); err != nil {
			return Config{}, fmt.Errorf("text_config: %w", err)
		}
		if text.QuantizationConfig == nil {
			text.QuantizationConfig = raw.QuantizationConfig
		}
		if text.TorchDType == "" && text.DType == "" {
			text.TorchDType, text.DType = raw.TorchDType, raw.DType
		}
		raw = text
	}
	c := Config{
		ModelType:        raw.ModelType,
		HiddenSize:       raw.HiddenSize,
		IntermediateSize: raw.IntermediateSize,
		NumLayers:        raw.NumLayers,
		NumHeads:         raw.NumHeads,
		HeadDim:          raw.HeadDim,
		VocabSize:        raw.VocabSize,
		MaxContext:       raw.MaxPosition,
		DType:            cmpOr(raw.TorchDType, raw.DType),
		KVLoRARank:       raw.KVLoRARank,
		QKRopeHeadDim:    raw.QKRopeHeadDim,
		Experts:          max(raw.NumLocalExperts, raw.NumExperts, raw.NRoutedExperts),
		ExpertsPerToken:  raw.ExpertsPerTok,
		MoEIntermediate:  raw.MoEIntermediate,
	}
	if raw.NumKVHeads != nil {
		c.NumKVHeads = *raw.NumKVHeads
	}
	if q := raw.QuantizationConfig; q != nil {
		c.Quant = strings.ToLower(q.QuantMethod)
		c.QuantBits = max(q.Bits, q.WBits)
	}
	switch {
	case slices.Contains(stateSpace, strings.ToLower(raw.ModelType)) || raw.SSMStateSize > 0 || raw.HybridOverridePatt != "" || raw.LinearNumKeyHeads > 0:
		c.Unsupported = fmt.Sprintf("model_type %q keeps state-space or linear-attention state, not only a KV cache; its memory is not estimated", raw.ModelType)
	case raw.IsEncoderDecoder:
		c.Unsupported = fmt.Sprintf("model_type %q is an encoder-decoder model; only decoder-only models are estimated", raw.ModelType)
	case raw.AttentionChunkSize > 0:
		c.Unsupported = fmt.Sprintf("model_type %q uses chunked local attention (attention_chunk_size %d); its cache is not estimated", raw.ModelType, raw.AttentionChunkSize)
	}
	if raw.SlidingWindow != nil {
		c.SlidingWindow = *raw.SlidingWindow
	}
	kinds, err := layerKinds(raw, c.SlidingWindow)
	if err != nil {
		return Config{}, err
	}
	c.LayerKinds = kinds
	if c.Unsupported == "" {
		if err := c.check(); err != nil {
			return Config{}, err
		}
	}
	return c, nil
}

// layerKinds says which layers attend to a sliding window. config.json's
// layer_types says it outright in newer models; otherwise it follows the
// model type's rule, as transformers and vLLM apply it.
func layerKinds(raw rawConfig, window int) ([]string, error) {
	n := raw.NumLayers
	if n <= 0 || n > 4096 {
		return nil, nil // check reports it
	}
	if len(raw.LayerTypes) > 0 {
		if len(raw.LayerTypes) != n {
			return nil, fmt.Errorf("layer_types: %d entries for %d layers", len(raw.LayerTypes), n)
		}
		for i, k := range raw.LayerTypes {
			if k != "full_attention" && k != "sliding_attention" {
				return nil, fmt.Errorf("layer_types[%d]: %q is not supported (only full_attention and sliding_attention are estimated)", i, k)
			}
		}
		return slices.Clone(raw.LayerTypes), nil
	}
	kinds := make([]string, n)
	sliding := func(i int) bool { return false }
	mt := strings.ToLower(raw.ModelType)
	switch {
	case window <= 0:
	case mt == "gemma2":
		// Gemma 2 alternates, starting with a sliding layer.
		sliding = func(i int) bool { return i%2 == 0 }
	case mt == "gemma3" || mt == "gemma3_text":
		p := raw.SlidingPattern
		if p <= 0 {
			p = 6
		}
		sliding = func(i int) bool { return (i+1)%p != 0 }
	case mt == "qwen2" || mt == "qwen2_moe" || mt == "qwen3" || mt == "qwen3_moe":
		// Qwen configs carry a window they do not use unless told to.
		if raw.UseSlidingWindow != nil && *raw.UseSlidingWindow {
			sliding = func(i int) bool { return i >= raw.MaxWindowLayers }
		}
	case raw.UseSlidingWindow != nil && !*raw.UseSlidingWindow:
	case mt == "mistral" || mt == "mixtral" || mt == "phi3" || mt == "starcoder2" || (raw.UseSlidingWindow != nil && *raw.UseSlidingWindow):
		sliding = func(int) bool { return true }
	}
	for i := range kinds {
		kinds[i] = "full_attention"
		if sliding(i) {
			kinds[i] = "sliding_attention"
		}
	}
	return kinds, nil
}

// check refuses a config whose shape fields are missing or absurd, naming
// the field.
func (c Config) check() error {
	need := func(field string, v, hi int) error {
		if v <= 0 || v > hi {
			return fmt.Errorf("%s: %d, want 1 to %d", field, v, hi)
		}
		return nil
	}
	for _, f := range []struct {
		name  string
		v, hi int
	}{
		{"num_hidden_layers", c.NumLayers, 4096},
		{"num_attention_heads", c.NumHeads, 1 << 16},
		{"hidden_size", c.HiddenSize, 1 << 20},
	} {
		if err := need(f.name, f.v, f.hi); err != nil {
			return err
		}
	}
	if c.NumKVHeads < 0 || c.NumKVHeads > c.NumHeads {
		return fmt.Errorf("num_key_value_heads: %d, want 1 to num_attention_heads (%d)", c.NumKVHeads, c.NumHeads)
	}
	if c.HeadDim < 0 || c.HeadDim > 1<<14 || (c.HeadDim == 0 && c.HiddenSize%c.NumHeads != 0) {
		return fmt.Errorf("head_dim: %d (hidden_size %d, %d heads), want a positive head_dim", c.HeadDim, c.HiddenSize, c.NumHeads)
	}
	if c.KVLoRARank < 0 || c.QKRopeHeadDim < 0 || c.KVLoRARank > 1<<16 || c.QKRopeHeadDim > 1<<14 {
		return fmt.Errorf("kv_lora_rank %d / qk_rope_head_dim %d: want small non-negative numbers", c.KVLoRARank, c.QKRopeHeadDim)
	}
	if c.SlidingWindow < 0 {
		return fmt.Errorf("sliding_window: %d, want a positive window or none", c.SlidingWindow)
	}
	if c.MaxContext < 0 {
		return fmt.Errorf("max_position_embeddings: %d, want a positive length", c.MaxContext)
	}
	return nil
}

// kvHeads is the number of key/value heads, defaulted.
func (c Config) kvHeads() int {
	if c.NumKVHeads > 0 {
		return c.NumKVHeads
	}
	return c.NumHeads
}

// headDim is the attention head size, defaulted.
func (c Config) headDim() int {
	if c.HeadDim > 0 {
		return c.HeadDim
	}
	return c.HiddenSize / c.NumHeads
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
