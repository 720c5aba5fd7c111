package placement

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// LoRA adapters on a deployment (cluster protocol 6).
//
// max_loras (and max_lora_rank) switch LoRA on: they size buffers the
// engine allocates at start (vLLM --max-loras, --max-lora-rank), so they
// are part of the spec version. The adapters are registered on every
// ready replica at runtime through the engine's own endpoints (vLLM's
// /v1/load_lora_adapter, SGLang's /load_lora_adapter), so for those
// engines the list stays out of the spec version: adding or removing one
// restarts no engine. llama.cpp takes adapters only at start (--lora), so
// for it the list is part of the spec version.

// Adapter is one LoRA adapter of a deployment.
type Adapter struct {
	// Name is what a request names in model to get the adapter.
	Name string `json:"name"`
	// Source is where the engine loads it from: a directory in the
	// node's weights dir (sql-lora, org/sql-lora), an absolute path the
	// engine can read (/data/adapters/sql-lora), or a hub id the engine
	// resolves itself (org/sql-lora, when the weights dir has no such
	// directory).
	Source string `json:"source"`
}

// The bounds of the LoRA fields.
const (
	// MaxLoras bounds max_loras, the adapters in one batch (GPU slots).
	MaxLoras = 64
	// MaxAdapters bounds the adapters of one deployment.
	MaxAdapters = 256
	// DefaultLoraRank is vLLM's default max_lora_rank (LoRAConfig in
	// vllm/config/lora.py), used when a deployment names none.
	DefaultLoraRank = 16
)

// loraRanks are the max_lora_rank values vLLM accepts (MaxLoRARanks in
// vllm/config/lora.py): any other refuses to start.
var loraRanks = []int{1, 8, 16, 32, 64, 128, 256, 320, 512}

var (
	// adapterName: a model name a client can send, never with ':', which
	// SGLang reads as base:adapter.
	adapterName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	// sourceSegment is one segment of a relative source.
	sourceSegment = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// validateLoRA checks the LoRA fields of d (after WithDefaults).
func (d Deployment) validateLoRA() error {
	bad := func(field, value, want string) error { return &FieldError{Field: field, Value: value, Want: want} }
	if d.MaxLoras < 0 || d.MaxLoras > MaxLoras {
		return bad("max_loras", strconv.Itoa(d.MaxLoras), fmt.Sprintf("from 1 to %d adapters in one batch (or leave it out: no LoRA)", MaxLoras))
	}
	if d.MaxLoraRank != 0 && !slices.Contains(loraRanks, d.MaxLoraRank) {
		return bad("max_lora_rank", strconv.Itoa(d.MaxLoraRank), "one of 1, 8, 16, 32, 64, 128, 256, 320, 512, as vLLM takes (or leave it out: 16)")
	}
	if d.MaxLoraRank != 0 && d.MaxLoras == 0 {
		return bad("max_lora_rank", strconv.Itoa(d.MaxLoraRank), "only with max_loras, which turns LoRA on")
	}
	if len(d.Adapters) > MaxAdapters {
		return bad("adapters", strconv.Itoa(len(d.Adapters)), fmt.Sprintf("at most %d adapters", MaxAdapters))
	}
	if len(d.Adapters) > 0 && d.MaxLoras == 0 && d.Engine != "llamacpp" {
		return bad("adapters", d.Adapters[0].Name, "with max_loras (the adapters one batch may hold, e.g. max_loras: 4), which turns LoRA on in the engine")
	}
	seen := map[string]bool{}
	for i, a := range d.Adapters {
		field := fmt.Sprintf("adapters[%d]", i)
		if !adapterName.MatchString(a.Name) {
			return bad(field+".name", a.Name, "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit (a model name a client sends)")
		}
		if a.Name == d.Name {
			return bad(field+".name", a.Name, "a name other than the deployment's own")
		}
		if seen[a.Name] {
			return bad(field+".name", a.Name, "a name given once: two adapters of one deployment have one name")
		}
		seen[a.Name] = true
		if err := validateSource(a.Source); err != nil {
			return bad(field+".source", a.Source, err.Error())
		}
	}
	return nil
}

// validateSource accepts an absolute path without ".." or a relative path
// of plain segments (a directory in the weights dir, or a hub id).
func validateSource(src string) error {
	want := fmt.Errorf("a directory in the weights dir (sql-lora or org/sql-lora), an absolute path the engine can read (/data/adapters/sql-lora), or a hub id (org/name); at most 512 characters, no '..'")
	if src == "" || len(src) > 512 || strings.ContainsAny(src, "\x00\n\r\t\\: ") {
		return want
	}
	rel := strings.TrimPrefix(src, "/")
	for _, seg := range strings.Split(rel, "/") {
		if !sourceSegment.MatchString(seg) || seg == ".." {
			return want
		}
	}
	return nil
}

// ValidAdapterName reports whether name may name a LoRA adapter.
func ValidAdapterName(name string) bool { return adapterName.MatchString(name) }

// AdapterNames lists d's adapters' names in order.
func (d Deployment) AdapterNames() []string {
	out := make([]string, len(d.Adapters))
	for i, a := range d.Adapters {
		out[i] = a.Name
	}
	return out
}

// AdaptersAtStart reports whether d's engine takes its adapters only at
// start (llama.cpp's --lora), so that they are part of its spec version.
func (d Deployment) AdaptersAtStart() bool { return d.Engine == "llamacpp" }
