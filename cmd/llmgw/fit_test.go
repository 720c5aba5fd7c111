package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/placement/fit"
	"github.com/llmgw/llmgw/placement/fit/fittest"
	"github.com/llmgw/llmgw/probes/weights/weightstest"
)

func TestFitJSON(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "llama")
	if err := weightstest.WriteDir(dir, fittest.Llama31_8B(), 2); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "fit", dir, "--gpu", "H100-80GB", "--gpu", "L4-24GB", "--max-model-len", "8192", "--max-num-seqs", "1", "--json")
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
	out, err = run(t, "fit", dir, "--gpu", "H100-80GB", "--max-model-len", "8192", "--max-num-seqs", "1")
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

// Against a running node: fit reads the headers from the node that has the
// model and sizes for the cluster's GPUs; place --gpu-memory auto stores the
// figure; nodes lists what the node has cached.
func TestFitAndPlaceAutoAgainstANode(t *testing.T) {
	wdir := t.TempDir()
	if _, err := weightstest.WriteHubCache(wdir, "meta-llama/Llama-3.1-8B", fittest.Llama31_8B(), 2); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(t.TempDir(), "n1")
	n := startNode(t, "n1", dataDir, "--weights-dir", wdir, "--hub-url", "")
	tok := filepath.Join(dataDir, "token")
	out, err := run(t, "fit", "meta-llama/Llama-3.1-8B", "--addr", n.api, "--token-file", tok, "--hub-url", "", "--max-model-len", "8192", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var r fitResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if r.WeightsBytes != 16_060_522_496 || len(r.GPUs) != 1 || r.GPUs[0].Name != "NVIDIA H100 80GB" || r.GPUs[0].PerNode != 1 || !r.GPUs[0].Fits {
		t.Errorf("fit against the node: %+v", r)
	}
	// Without the token the node does not hand out headers, and there is
	// no hub: a clear error.
	if _, err := run(t, "fit", "meta-llama/Llama-3.1-8B", "--addr", n.api, "--hub-url", ""); err == nil || !strings.Contains(err.Error(), "--hub-url is empty") {
		t.Errorf("no token, no hub: %v", err)
	}

	out, err = run(t, "place", "llama", "--model", "meta-llama/Llama-3.1-8B", "--engine", "fake", "--gpu-memory", "auto", "--max-model-len", "8192",
		"--addr", n.api, "--token-file", tok, "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var info struct {
		GPUMemory   string `json:"gpu_memory"`
		MaxModelLen int    `json:"max_model_len"`
		Fit         struct {
			Source string `json:"source"`
		} `json:"fit"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if info.GPUMemory == "" || info.MaxModelLen != 8192 || !strings.HasPrefix(info.Fit.Source, "local ") {
		t.Errorf("placed %s", out)
	}
	// With an explicit share the counts are passed on, checked against the
	// share by the node, which has the model's headers.
	if _, err := run(t, "place", "x", "--model", "meta-llama/Llama-3.1-8B", "--engine", "fake", "--gpu-memory", "24GiB", "--max-model-len", "8192", "--max-num-seqs", "64",
		"--addr", n.api, "--token-file", tok); err == nil || !strings.Contains(err.Error(), "max_num_seqs 64: gpu_memory 24GiB holds at most ") {
		t.Errorf("--max-num-seqs 64 in 24GiB: %v", err)
	}
	if _, err := run(t, "place", "x", "--model", "m", "--max-num-seqs", "0", "--addr", n.api); err == nil || !strings.Contains(err.Error(), "--max-num-seqs 0: want 1 or more") {
		t.Errorf("--max-num-seqs 0: %v", err)
	}
	out, err = run(t, "nodes", "--addr", n.api)
	if err != nil || !strings.Contains(out, "WEIGHTS") || !strings.Contains(out, "meta-llama/Llama-3.1-8B (") {
		t.Errorf("nodes: %v\n%s", err, out)
	}
}

// With no cluster and no --gpu, fit still prints what the model needs and
// says how to compare it with GPUs: exit status 0. A node named by --addr
// that does not answer is still an error.
func TestFitWithoutAClusterPrintsTheNeeds(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "llama")
	if err := weightstest.WriteDir(dir, fittest.Llama31_8B(), 2); err != nil {
		t.Fatal(err)
	}
	// The default address, 127.0.0.1:7070, where no node runs in tests.
	t.Setenv("LLMGW_ADDR", "")
	os.Unsetenv("LLMGW_ADDR")
	out, err := run(t, "fit", dir, "--max-model-len", "8192")
	if err != nil {
		t.Fatalf("fit with no cluster: %v\n%s", err, out)
	}
	for _, want := range []string{"8.03 B", "16.06 GB", "128.0 KiB per token", "15.0 GiB weights + 1.0 GiB KV cache",
		"no node answers at http://127.0.0.1:7070", "name a GPU with --gpu or point --addr at a node to compare"} {
		if !strings.Contains(out, want) {
			t.Errorf("fit output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "FITS") {
		t.Errorf("a GPU table with no GPU:\n%s", out)
	}

	// --json: the figures on stdout, the hint on stderr.
	app := newApp()
	var stdout, stderr bytes.Buffer
	app.Writer, app.ErrWriter = &stdout, &stderr
	if err := app.Run(context.Background(), []string{"llmgw", "fit", dir, "--max-model-len", "8192", "--json"}); err != nil {
		t.Fatal(err)
	}
	var r fitResult
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	if r.WeightsBytes != 16_060_522_496 || r.PerGPU.KVCache != 1<<30 || r.GPUs == nil || len(r.GPUs) != 0 {
		t.Errorf("fit --json with no cluster: %+v", r)
	}
	if !strings.Contains(stderr.String(), noGPUHint) {
		t.Errorf("stderr lacks the hint: %q", stderr.String())
	}

	_, err = run(t, "fit", dir, "--addr", "http://127.0.0.1:1")
	if exitStatus(err) != 1 || !strings.Contains(fmt.Sprint(err), "cannot reach a node at http://127.0.0.1:1") {
		t.Errorf("fit --addr with no node there: status %d, %v; want 1 and what failed", exitStatus(err), err)
	}
}

// Without --max-num-seqs, fit sizes for what a place with gpu_memory auto
// would: up to 16 full-context sequences that the largest GPU type holds
// (Llama-3.1-8B at 8,192 tokens: 1 GiB of KV each, so 16 GiB on an H100),
// not one request at a time; with no GPU type to size for, one.
func TestFitSizesForTheConcurrencyPlaceWouldChoose(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "llama")
	if err := weightstest.WriteDir(dir, fittest.Llama31_8B(), 2); err != nil {
		t.Fatal(err)
	}
	var r fitResult
	out, err := run(t, "fit", dir, "--gpu", "H100-80GB", "--gpu", "L4-24GB", "--max-model-len", "8192", "--json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if r.MaxNumSeqs != 16 || r.PerGPU.KVCache != 16<<30 {
		t.Errorf("sized for %d sequences, %d bytes of KV: want 16 and 16 GiB", r.MaxNumSeqs, r.PerGPU.KVCache)
	}
	if n := chosenSeqs(fit.Profile{}, fit.Request{TensorParallel: 1}, nil); n != 1 {
		t.Errorf("without a GPU type: %d sequences, want 1", n)
	}
	if _, err := run(t, "fit", dir, "--gpu", "H100-80GB", "--max-num-seqs", "0"); err == nil || !strings.Contains(err.Error(), "--max-num-seqs 0") {
		t.Errorf("--max-num-seqs 0: %v", err)
	}
}
