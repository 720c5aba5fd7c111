package fit

import (
	"fmt"
	"regexp"
	"strings"
)

// Tensor is one entry of a safetensors or GGUF header.
type Tensor struct {
	Name  string   `json:"name"`
	DType string   `json:"dtype"`
	Shape []uint64 `json:"shape"`
}

// Weights sums a model's tensors.
type Weights struct {
	// Bytes is what the tensors occupy as stored, which is what an engine
	// loads for formats it runs natively (bf16, FP8, AWQ/GPTQ int4 with its
	// scales, GGUF blocks).
	Bytes uint64 `json:"bytes"`
	// Params counts logical weights: a packed int32 holding eight 4-bit
	// weights counts eight; quantisation scales and zero points count none.
	Params uint64 `json:"params"`
	// LayerBytes is the part of Bytes in numbered layers; the rest
	// (embeddings, final norm, output head) sits on the first or last
	// pipeline stage.
	LayerBytes uint64 `json:"layer_bytes"`
	// ByDType is Bytes per tensor type.
	ByDType map[string]uint64 `json:"by_dtype"`
}

// maxTensors bounds a model's tensor list (DeepSeek-V3 has about 92,000
// with its FP8 scales).
const maxTensors = 1 << 20

var layerIndex = regexp.MustCompile(`(?:^|\.)(?:layers|h|blocks|blk|layer)\.(\d+)\.`)

// metadataSuffixes name quantisation metadata: stored, but not weights.
var metadataSuffixes = []string{
	".scales", ".qzeros", ".g_idx", ".weight_scale", ".weight_scale_inv", ".input_scale",
	".weight_zero_point", ".weight_g_idx", ".weight_shape", ".k_scale", ".v_scale",
	"_scales", ".output_scale",
}

// SumWeights adds up tensors. bits is the packed weights' width for AWQ or
// GPTQ checkpoints (0: 4). An unknown dtype or a shape that is not whole
// blocks is an error naming the tensor.
func SumWeights(tensors []Tensor, bits int) (Weights, error) {
	if len(tensors) > maxTensors {
		return Weights{}, fmt.Errorf("%d tensors, at most %d", len(tensors), maxTensors)
	}
	if bits <= 0 {
		bits = 4
	}
	if 32%bits != 0 {
		return Weights{}, fmt.Errorf("quantization bits %d: want 2, 4 or 8", bits)
	}
	w := Weights{ByDType: map[string]uint64{}}
	for _, t := range tensors {
		n := uint64(1)
		for _, d := range t.Shape {
			if d != 0 && n > (1<<62)/d {
				return Weights{}, fmt.Errorf("tensor %s: shape %v is too large", t.Name, t.Shape)
			}
			n *= d
		}
		b, err := tensorBytes(t.DType, n)
		if err != nil {
			return Weights{}, fmt.Errorf("tensor %s: %w", t.Name, err)
		}
		w.Bytes += b
		w.ByDType[t.DType] += b
		if layerIndex.MatchString(t.Name) {
			w.LayerBytes += b
		}
		w.Params += params(t, n, bits)
	}
	return w, nil
}

// params is the number of logical weights a tensor holds.
func params(t Tensor, n uint64, bits int) uint64 {
	for _, s := range metadataSuffixes {
		if strings.HasSuffix(t.Name, s) {
			return 0
		}
	}
	packed := strings.HasSuffix(t.Name, ".qweight") || strings.HasSuffix(t.Name, ".weight_packed")
	switch {
	case packed && (t.DType == "I32" || t.DType == "U32"):
		return n * uint64(32/bits)
	case strings.HasSuffix(t.Name, "_blocks") && t.DType == "U8":
		return n * 2 // MXFP4: two 4-bit weights a byte
	}
	return n
}
