package weights

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/llmgw/llmgw/placement/fit"
)

// ggmlTypes names ggml's tensor types by their number in the GGUF format.
var ggmlTypes = map[uint32]string{
	0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
	10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
	16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
	22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
	29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}

// GGMLTypeID is the GGUF number of a ggml type name, for writers of test
// fixtures.
func GGMLTypeID(name string) (uint32, bool) {
	for id, n := range ggmlTypes {
		if n == name {
			return id, true
		}
	}
	return 0, false
}

// GGUF metadata value types.
const (
	ggufU8 = iota
	ggufI8
	ggufU16
	ggufI16
	ggufU32
	ggufI32
	ggufF32
	ggufBool
	ggufString
	ggufArray
	ggufU64
	ggufI64
	ggufF64
)

// rangeReader reads a file front to back in chunks of ranged reads, so a
// GGUF header is read without knowing its length first and without the
// tensors after it.
type rangeReader struct {
	ctx   context.Context
	files Files
	name  string
	off   int64
}

const chunk = 1 << 20

func (r *rangeReader) Read(p []byte) (int, error) {
	b, err := r.files.ReadRange(r.ctx, r.name, r.off, int64(min(len(p), chunk)))
	if err != nil {
		return 0, err
	}
	if len(b) == 0 {
		return 0, io.EOF
	}
	r.off += int64(len(b))
	return copy(p, b), nil
}

// ggufParser reads the header fields in order.
type ggufParser struct {
	r     *bufio.Reader
	read  int64
	where string
	err   error
}

func (p *ggufParser) bytes(n uint64) []byte {
	if p.err != nil {
		return nil
	}
	if n > MaxHeader || p.read+int64(n) > MaxHeader {
		p.err = fmt.Errorf("header is over the %d MiB cap", MaxHeader>>20)
		return nil
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(p.r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("truncated header after %d bytes", p.read)
		}
		p.err = err
		return nil
	}
	p.read += int64(n)
	return b
}

func (p *ggufParser) u32() uint32 {
	if b := p.bytes(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (p *ggufParser) u64() uint64 {
	if b := p.bytes(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (p *ggufParser) str() string {
	n := p.u64()
	if n > 1<<24 {
		p.fail("a string of %d bytes", n)
		return ""
	}
	return string(p.bytes(n))
}

func (p *ggufParser) fail(format string, args ...any) {
	if p.err == nil {
		p.err = fmt.Errorf(format, args...)
	}
}

// value reads one metadata value; arrays are skipped and come back as
// their length.
func (p *ggufParser) value(t uint32, depth int) any {
	switch t {
	case ggufU8, ggufI8, ggufBool:
		if b := p.bytes(1); b != nil {
			return uint64(b[0])
		}
	case ggufU16, ggufI16:
		if b := p.bytes(2); b != nil {
			return uint64(binary.LittleEndian.Uint16(b))
		}
	case ggufU32, ggufI32:
		return uint64(p.u32())
	case ggufF32:
		return float64(math.Float32frombits(p.u32()))
	case ggufU64, ggufI64:
		return p.u64()
	case ggufF64:
		return math.Float64frombits(p.u64())
	case ggufString:
		return p.str()
	case ggufArray:
		et, n := p.u32(), p.u64()
		if depth > 2 || n > MaxHeader {
			p.fail("an array of %d entries", n)
			return nil
		}
		for i := uint64(0); i < n && p.err == nil; i++ {
			p.value(et, depth+1)
		}
		return arrayLen(n)
	default:
		p.fail("unknown metadata type %d", t)
	}
	return nil
}

// arrayLen stands for a skipped array.
type arrayLen uint64

// ReadGGUF reads a GGUF file's header: magic, version, the metadata (the
// tokenizer's arrays skipped) and the tensor list. The tensors' data is
// never read.
func ReadGGUF(ctx context.Context, files Files, name string) (fit.Model, error) {
	where := files.Where() + "/" + name
	p := &ggufParser{r: bufio.NewReaderSize(&rangeReader{ctx: ctx, files: files, name: name}, chunk), where: where}
	if magic := p.bytes(4); p.err == nil && string(magic) != "GGUF" {
		return fit.Model{}, fmt.Errorf("%s: not a GGUF file (magic %q)", where, magic)
	}
	version := p.u32()
	if p.err == nil && (version < 2 || version > 3) {
		return fit.Model{}, fmt.Errorf("%s: GGUF version %d: want 2 or 3", where, version)
	}
	nTensors, nKV := p.u64(), p.u64()
	if p.err == nil && (nTensors > 1<<20 || nKV > 1<<20) {
		return fit.Model{}, fmt.Errorf("%s: %d tensors and %d metadata keys: not a model header", where, nTensors, nKV)
	}
	meta := map[string]any{}
	for i := uint64(0); i < nKV && p.err == nil; i++ {
		k := p.str()
		meta[k] = p.value(p.u32(), 0)
	}
	tensors := make([]fit.Tensor, 0, min(nTensors, 1<<16))
	for i := uint64(0); i < nTensors && p.err == nil; i++ {
		tn := p.str()
		dims := p.u32()
		if dims > 8 {
			p.fail("tensor %s: %d dimensions", tn, dims)
			break
		}
		shape := make([]uint64, dims)
		for j := range shape {
			shape[j] = p.u64()
		}
		typ := p.u32()
		p.u64() // offset
		dt, ok := ggmlTypes[typ]
		if p.err == nil && !ok {
			p.fail("tensor %s: unknown dtype %d", tn, typ)
		}
		tensors = append(tensors, fit.Tensor{Name: tn, DType: dt, Shape: shape})
	}
	if p.err != nil {
		return fit.Model{}, fmt.Errorf("%s: %w", where, p.err)
	}
	cfg, err := ggufConfig(meta)
	if err != nil {
		return fit.Model{}, fmt.Errorf("%s: %w", where, err)
	}
	return fit.Model{Name: name, Format: "gguf", Config: cfg, Tensors: tensors}, nil
}

// ggufConfig maps llama.cpp's metadata keys onto config.json's, and lets
// fit.ParseConfig apply the same rules to both.
func ggufConfig(meta map[string]any) (fit.Config, error) {
	arch, _ := meta["general.architecture"].(string)
	if arch == "" {
		return fit.Config{}, errors.New("metadata has no general.architecture")
	}
	num := func(key string) any {
		switch v := meta[arch+"."+key].(type) {
		case uint64:
			return v
		case arrayLen:
			return fmt.Sprintf("per-layer %s", key)
		}
		return nil
	}
	cfg := map[string]any{"model_type": arch, "torch_dtype": "float16"}
	for k, key := range map[string]string{
		"num_hidden_layers":       "block_count",
		"hidden_size":             "embedding_length",
		"intermediate_size":       "feed_forward_length",
		"num_attention_heads":     "attention.head_count",
		"num_key_value_heads":     "attention.head_count_kv",
		"max_position_embeddings": "context_length",
		"head_dim":                "attention.key_length",
		"sliding_window":          "attention.sliding_window",
		"num_local_experts":       "expert_count",
		"num_experts_per_tok":     "expert_used_count",
		"kv_lora_rank":            "attention.kv_lora_rank",
		"vocab_size":              "vocab_size",
	} {
		v := num(key)
		if s, ok := v.(string); ok {
			return fit.Config{}, fmt.Errorf("%s.%s: %s are not estimated", arch, key, s)
		}
		if v != nil {
			cfg[k] = v
		}
	}
	if _, ok := cfg["vocab_size"]; !ok {
		if n, ok := meta["tokenizer.ggml.tokens"].(arrayLen); ok {
			cfg["vocab_size"] = uint64(n)
		}
	}
	if _, ok := cfg["kv_lora_rank"]; ok {
		cfg["qk_rope_head_dim"] = num("rope.dimension_count")
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return fit.Config{}, err
	}
	return fit.ParseConfig(b)
}
