// Package weightstest writes header-only model files (config.json,
// safetensors headers with no tensor data, GGUF headers) from
// placement/fit/fittest's families, for tests and scenarios: a few hundred
// KiB stand in for tens of GB.
package weightstest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/llmgw/llmgw/placement/fit"
	"github.com/llmgw/llmgw/placement/fit/fittest"
	"github.com/llmgw/llmgw/probes/weights"
)

// SafetensorsHeader is one file's header: the 8-byte length and the JSON,
// with data offsets as the real file would have them.
func SafetensorsHeader(ts []fit.Tensor) ([]byte, error) {
	type entry struct {
		DType       string    `json:"dtype"`
		Shape       []uint64  `json:"shape"`
		DataOffsets [2]uint64 `json:"data_offsets"`
	}
	h := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var off uint64
	for _, t := range ts {
		w, err := fit.SumWeights([]fit.Tensor{t}, 0)
		if err != nil {
			return nil, err
		}
		h[t.Name] = entry{DType: t.DType, Shape: t.Shape, DataOffsets: [2]uint64{off, off + w.Bytes}}
		off += w.Bytes
	}
	js, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	return append(out, js...), nil
}

// WriteDir writes f as a model directory: config.json and its tensors in
// shards files (an index beside them when more than one).
func WriteDir(dir string, f fittest.Family, shards int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(f.Config), 0o644); err != nil {
		return err
	}
	shards = max(shards, 1)
	per := (len(f.Tensors) + shards - 1) / shards
	weightMap := map[string]string{}
	for i := range shards {
		part := f.Tensors[min(i*per, len(f.Tensors)):min((i+1)*per, len(f.Tensors))]
		name := "model.safetensors"
		if shards > 1 {
			name = fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, shards)
		}
		for _, t := range part {
			weightMap[t.Name] = name
		}
		h, err := SafetensorsHeader(part)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), h, 0o644); err != nil {
			return err
		}
	}
	if shards == 1 {
		return nil
	}
	idx, err := json.Marshal(map[string]any{"metadata": map[string]uint64{"total_size": 0}, "weight_map": weightMap})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644)
}

// WriteHubCache writes f into weightsDir as the hub cache lays out repo
// (ORG/NAME): models--ORG--NAME/{blobs,refs/main,snapshots/REV/*}, every
// snapshot file a symbolic link into blobs/.
func WriteHubCache(weightsDir, repo string, f fittest.Family, shards int) (string, error) {
	model := filepath.Join(weightsDir, "models--"+strings.ReplaceAll(repo, "/", "--"))
	const rev = "0123456789abcdef0123456789abcdef01234567"
	tmp := filepath.Join(model, ".staging")
	if err := WriteDir(tmp, f, shards); err != nil {
		return "", err
	}
	snap := filepath.Join(model, "snapshots", rev)
	for _, d := range []string{filepath.Join(model, "blobs"), filepath.Join(model, "refs"), snap} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return "", err
	}
	for i, e := range entries {
		blob := fmt.Sprintf("blob%04d", i)
		if err := os.Rename(filepath.Join(tmp, e.Name()), filepath.Join(model, "blobs", blob)); err != nil {
			return "", err
		}
		if err := os.Symlink(filepath.Join("..", "..", "blobs", blob), filepath.Join(snap, e.Name())); err != nil {
			return "", err
		}
	}
	if err := os.Remove(tmp); err != nil {
		return "", err
	}
	return model, os.WriteFile(filepath.Join(model, "refs", "main"), []byte(rev), 0o644)
}

// GGUFHeader is a GGUF v3 header of f's metadata and tensors.
func GGUFHeader(f fittest.Family) ([]byte, error) {
	var b bytes.Buffer
	le := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	str := func(s string) { le(uint64(len(s))); b.WriteString(s) }
	b.WriteString("GGUF")
	le(uint32(3))
	le(uint64(len(f.Tensors)))
	keys := make([]string, 0, len(f.GGUF))
	for k := range f.GGUF {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	le(uint64(len(keys) + 1))
	for _, k := range keys {
		str(k)
		switch v := f.GGUF[k].(type) {
		case uint32:
			le(uint32(4))
			le(v)
		case float32:
			le(uint32(6))
			le(math.Float32bits(v))
		case string:
			le(uint32(8))
			str(v)
		default:
			return nil, fmt.Errorf("metadata %s: type %T", k, v)
		}
	}
	// A tokenizer array, skipped by the reader as the real ones are.
	str("tokenizer.ggml.tokens")
	le(uint32(9))
	le(uint32(8))
	le(uint64(3))
	for _, t := range []string{"<s>", "</s>", "hi"} {
		str(t)
	}
	var off uint64
	for _, t := range f.Tensors {
		str(t.Name)
		le(uint32(len(t.Shape)))
		for _, d := range t.Shape {
			le(d)
		}
		id, ok := weights.GGMLTypeID(t.DType)
		if !ok {
			return nil, fmt.Errorf("tensor %s: no GGUF type %s", t.Name, t.DType)
		}
		le(id)
		le(off)
		w, err := fit.SumWeights([]fit.Tensor{t}, 0)
		if err != nil {
			return nil, err
		}
		off += (w.Bytes + 31) / 32 * 32
	}
	return b.Bytes(), nil
}

// WriteGGUF writes f's GGUF header as path.
func WriteGGUF(path string, f fittest.Family) error {
	h, err := GGUFHeader(f)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, h, 0o644)
}
