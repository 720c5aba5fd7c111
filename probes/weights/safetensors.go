package weights

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/llmgw/llmgw/placement/fit"
)

// headerEntry is one tensor of a safetensors header.
type headerEntry struct {
	DType       string   `json:"dtype"`
	Shape       []uint64 `json:"shape"`
	DataOffsets []uint64 `json:"data_offsets"`
}

// ReadSafetensorsHeader reads one file's header: its first 8 bytes, a
// little-endian length, then that many bytes of JSON. The tensors after it
// are never read. Tensors come back sorted by name.
func ReadSafetensorsHeader(ctx context.Context, files Files, name string) ([]fit.Tensor, error) {
	where := files.Where() + "/" + name
	head, err := files.ReadRange(ctx, name, 0, 8)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if len(head) < 8 {
		return nil, fmt.Errorf("%s: truncated: %d bytes, shorter than the 8-byte header length", where, len(head))
	}
	n := binary.LittleEndian.Uint64(head)
	if n > MaxHeader {
		return nil, fmt.Errorf("%s: header length %d is over the %d MiB cap: not a safetensors file", where, n, MaxHeader>>20)
	}
	if n < 2 {
		return nil, fmt.Errorf("%s: header length %d: not a safetensors file", where, n)
	}
	body, err := files.ReadRange(ctx, name, 8, int64(n))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if uint64(len(body)) < n {
		return nil, fmt.Errorf("%s: truncated header: %d of %d bytes", where, len(body), n)
	}
	return parseSafetensorsHeader(where, body)
}

func parseSafetensorsHeader(where string, body []byte) ([]fit.Tensor, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%s: header is not JSON: %w", where, err)
	}
	names := make([]string, 0, len(raw))
	for k := range raw {
		if k != "__metadata__" {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	out := make([]fit.Tensor, 0, len(names))
	for _, k := range names {
		var e headerEntry
		if err := json.Unmarshal(raw[k], &e); err != nil {
			return nil, fmt.Errorf("%s: tensor %s: %w", where, k, err)
		}
		if !fit.KnownDType(e.DType) {
			return nil, fmt.Errorf("%s: tensor %s: unknown dtype %q", where, k, e.DType)
		}
		if len(e.Shape) > 8 {
			return nil, fmt.Errorf("%s: tensor %s: %d dimensions", where, k, len(e.Shape))
		}
		out = append(out, fit.Tensor{Name: k, DType: e.DType, Shape: e.Shape})
	}
	return out, nil
}

// index is model.safetensors.index.json.
type index struct {
	WeightMap map[string]string `json:"weight_map"`
}

// safetensorsFiles lists the files holding a checkpoint's tensors: those
// its index names, or model.safetensors alone.
func safetensorsFiles(ctx context.Context, files Files) ([]string, error) {
	b, err := files.ReadFile(ctx, "model.safetensors.index.json", maxConfig)
	if err != nil {
		if isNotFound(err) {
			return []string{"model.safetensors"}, nil
		}
		return nil, fmt.Errorf("%s/model.safetensors.index.json: %w", files.Where(), err)
	}
	var idx index
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("%s/model.safetensors.index.json: %w", files.Where(), err)
	}
	var out []string
	for _, f := range idx.WeightMap {
		if f == "" || strings.ContainsAny(f, "/\\") || f == "." || f == ".." || !strings.HasSuffix(f, ".safetensors") {
			return nil, fmt.Errorf("%s/model.safetensors.index.json: weight_map names %q: want a .safetensors file beside the index", files.Where(), f)
		}
		out = append(out, f)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) == 0 {
		return nil, fmt.Errorf("%s/model.safetensors.index.json: weight_map is empty", files.Where())
	}
	if len(out) > maxShards {
		return nil, fmt.Errorf("%s/model.safetensors.index.json: %d files, at most %d", files.Where(), len(out), maxShards)
	}
	return out, nil
}
