package fit

import (
	"fmt"
	"strings"
)

// dtype is how a tensor type stores its elements: blockBytes bytes for every
// blockElems elements. Plain types have blocks of one element; GGUF's
// quantised types pack 32 or 256 weights with their scales into one block.
type dtype struct {
	blockElems uint64
	blockBytes uint64
}

// dtypes names every tensor type this package can size. safetensors names
// (BF16, F8_E4M3, ...) and GGUF's (Q4_K, IQ4_XS, ...) share the table; where
// both use a name (F32, F16, BF16, I8, ...) they mean the same layout. GGUF
// block sizes are ggml's: Q4_K is 256 weights in 2+2 bytes of super-block
// scales, 12 bytes of 6-bit sub-block scales and 128 bytes of nibbles.
var dtypes = map[string]dtype{
	// safetensors
	"F64": {1, 8}, "F32": {1, 4}, "F16": {1, 2}, "BF16": {1, 2},
	"I64": {1, 8}, "I32": {1, 4}, "I16": {1, 2}, "I8": {1, 1},
	"U64": {1, 8}, "U32": {1, 4}, "U16": {1, 2}, "U8": {1, 1}, "BOOL": {1, 1},
	"F8_E4M3": {1, 1}, "F8_E5M2": {1, 1}, "F8_E8M0": {1, 1},
	"F8_E4M3FNUZ": {1, 1}, "F8_E5M2FNUZ": {1, 1},
	"F4": {2, 1}, // FP4 E2M1, two to a byte
	// GGUF (ggml type names)
	"Q4_0": {32, 18}, "Q4_1": {32, 20}, "Q5_0": {32, 22}, "Q5_1": {32, 24},
	"Q8_0": {32, 34}, "Q8_1": {32, 36},
	"Q2_K": {256, 84}, "Q3_K": {256, 110}, "Q4_K": {256, 144}, "Q5_K": {256, 176},
	"Q6_K": {256, 210}, "Q8_K": {256, 292},
	"IQ2_XXS": {256, 66}, "IQ2_XS": {256, 74}, "IQ2_S": {256, 82},
	"IQ3_XXS": {256, 98}, "IQ3_S": {256, 110},
	"IQ1_S": {256, 50}, "IQ1_M": {256, 56},
	"IQ4_NL": {32, 18}, "IQ4_XS": {256, 136},
	"TQ1_0": {256, 54}, "TQ2_0": {256, 66},
	"MXFP4": {32, 17},
}

// KnownDType reports whether name is a tensor type this package can size.
func KnownDType(name string) bool { _, ok := dtypes[name]; return ok }

// tensorBytes is the stored size of n elements of type name.
func tensorBytes(name string, n uint64) (uint64, error) {
	d, ok := dtypes[name]
	if !ok {
		return 0, fmt.Errorf("unknown dtype %q", name)
	}
	if n%d.blockElems != 0 {
		return 0, fmt.Errorf("%d elements is not a whole number of %s blocks of %d", n, name, d.blockElems)
	}
	return n / d.blockElems * d.blockBytes, nil
}

// kvDTypeBytes is the size of one cached key or value element. "auto" (or
// empty) follows the model's dtype, as vLLM does; a float32 checkpoint is
// served in 16 bits, as vLLM does by default.
func kvDTypeBytes(kvDType, modelDType string) (uint64, error) {
	switch strings.ToLower(kvDType) {
	case "", "auto":
		switch strings.ToLower(modelDType) {
		case "", "bfloat16", "bf16", "float16", "f16", "half", "float32", "f32", "float":
			return 2, nil
		}
		return 0, fmt.Errorf("model dtype %q: want bfloat16, float16 or float32 (or name kv_cache_dtype)", modelDType)
	case "bfloat16", "bf16", "float16", "f16", "half":
		return 2, nil
	case "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc":
		return 1, nil
	}
	return 0, fmt.Errorf("kv_cache_dtype %q: want auto, bfloat16, float16 or fp8", kvDType)
}
