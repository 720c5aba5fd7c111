package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/placement/fit/fittest"
	"github.com/llmgw/llmgw/probes/weights/weightstest"
)

func TestFitJSON(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "llama")
	if err := weightstest.WriteDir(dir, fittest.Llama31_8B(), 2); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "fit", dir, "--gpu", "H100-80GB", "--gpu", "L4-24GB", "--max-model-len", "8192", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var r fitResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if r.Params != 8_030_261_248 || r.WeightsBytes != 16_060_522_496 || r.KVBytesPerToken != 128<<10 || r.MaxModelLen != 8192 || r.TensorParallel != 1 {
		t.Errorf("fit --json: %+v", r)
	}
	b := r.PerGPU
	if r.PerGPUBytes != b.Total || b.Total != b.Weights+b.KVCache+b.Framework+b.Activations+b.CUDAGraphs || b.KVCache != 1<<30 {
		t.Errorf("per GPU %d, breakdown %+v", r.PerGPUBytes, b)
	}
	if len(r.GPUs) != 2 || !r.GPUs[0].Fits || !r.GPUs[1].Fits || r.GPUs[0].MaxModelLen != 131072 || r.GPUs[0].MaxNumSeqs <= r.GPUs[1].MaxNumSeqs {
		t.Errorf("per GPU type: %+v", r.GPUs)
	}
	// Text: the terms, and a row per GPU type.
	out, err = run(t, "fit", dir, "--gpu", "H100-80GB", "--max-model-len", "8192")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"8.03 B", "16.06 GB", "128.0 KiB per token", "15.0 GiB weights + 1.0 GiB KV cache", "H100 80GB"} {
		if !strings.Contains(out, want) {
			t.Errorf("fit output lacks %q:\n%s", want, out)
		}
	}
}

func TestFitBadInput(t *testing.T) {
	empty := t.TempDir()
	if _, err := run(t, "fit", empty, "--gpu", "H100-80GB"); err == nil || !strings.Contains(err.Error(), "no config.json") || !strings.Contains(err.Error(), empty) {
		t.Errorf("a directory without config.json: %v", err)
	}
	if err := os.WriteFile(filepath.Join(empty, "config.json"), []byte(fittest.Llama31_8B().Config), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(empty, "model.safetensors"), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00}, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "fit", empty, "--gpu", "H100-80GB"); err == nil || !strings.Contains(err.Error(), "model.safetensors: header length") {
		t.Errorf("a header over the cap: %v", err)
	}
	if _, err := run(t, "fit", "not/../a-model", "--gpu", "H100-80GB"); err == nil || !strings.Contains(err.Error(), "not a hub id") {
		t.Errorf("a name that is neither a path nor a hub id: %v", err)
	}
	if _, err := run(t, "fit", empty, "--gpu", "H100"); err == nil || !strings.Contains(err.Error(), "--gpu") {
		t.Errorf("a bad --gpu: %v", err)
	}
}
