package weights_test

import (
	"context"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmgw/llmgw/placement/fit"
	"github.com/llmgw/llmgw/placement/fit/fittest"
	"github.com/llmgw/llmgw/probes/weights"
	"github.com/llmgw/llmgw/probes/weights/weightstest"
)

func families() []fittest.Family {
	return []fittest.Family{fittest.Llama31_8B(), fittest.Llama31_8B_FP8(), fittest.Qwen25_7B_AWQ(), fittest.Gemma2_9B(), fittest.Mixtral8x7B()}
}

// check reads what the files say back through the estimate and compares it
// with the family's published figures.
func check(t *testing.T, m fit.Model, f fittest.Family) {
	t.Helper()
	p, err := fit.Analyze(m, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := len(m.Tensors); got != len(f.Tensors) {
		t.Errorf("%d tensors read, %d written", got, len(f.Tensors))
	}
	if d := float64(p.Weights.Bytes)/float64(f.WeightsBytes) - 1; d > 0.01 || d < -0.01 {
		t.Errorf("weights %d, published %d", p.Weights.Bytes, f.WeightsBytes)
	}
	if p.KVBytesPerToken != f.KVBytesPerToken {
		t.Errorf("KV %d bytes a token, want %d", p.KVBytesPerToken, f.KVBytesPerToken)
	}
}

func TestPlainDirectories(t *testing.T) {
	for _, f := range families() {
		t.Run(f.Dir, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), f.Dir)
			if err := weightstest.WriteDir(dir, f, 4); err != nil {
				t.Fatal(err)
			}
			m, err := weights.LoadPath(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			check(t, m, f)
		})
	}
}

func TestHubCacheLayout(t *testing.T) {
	f := fittest.Llama31_8B()
	model, err := weightstest.WriteHubCache(t.TempDir(), "meta-llama/Llama-3.1-8B", f, 1)
	if err != nil {
		t.Fatal(err)
	}
	m, err := weights.LoadPath(context.Background(), model)
	if err != nil {
		t.Fatal(err)
	}
	check(t, m, f)
}

func TestGGUF(t *testing.T) {
	f := fittest.Llama31_8B_Q4KM()
	path := filepath.Join(t.TempDir(), f.Dir)
	if err := weightstest.WriteGGUF(path, f); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, filepath.Dir(path)} {
		m, err := weights.LoadPath(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		c := m.Config
		if m.Format != "gguf" || c.ModelType != "llama" || c.NumLayers != 32 || c.NumKVHeads != 8 || c.MaxContext != 131072 || c.VocabSize != 128256 {
			t.Errorf("%s: config %+v", p, c)
		}
		check(t, m, f)
	}
}

func TestHubByRanges(t *testing.T) {
	f := fittest.Mixtral8x7B()
	dir := t.TempDir()
	if err := weightstest.WriteDir(dir, f, 3); err != nil {
		t.Fatal(err)
	}
	var ranged, whole int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer hf_test" {
			http.Error(w, "gated", http.StatusUnauthorized)
			return
		}
		name, ok := strings.CutPrefix(r.URL.Path, "/mistralai/Mixtral-8x7B-v0.1/resolve/main/")
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Range") != "" {
			ranged++
		} else {
			whole++
		}
		http.ServeFile(w, r, filepath.Join(dir, filepath.Base(name)))
	}))
	defer srv.Close()
	hub := &weights.Hub{Base: srv.URL, Repo: "mistralai/Mixtral-8x7B-v0.1", Token: "hf_test", Client: srv.Client()}
	m, err := weights.Load(context.Background(), hub, "")
	if err != nil {
		t.Fatal(err)
	}
	check(t, m, f)
	// config.json and the index whole; each of 3 files: its length, then its header.
	if whole != 2 || ranged != 6 {
		t.Errorf("%d whole and %d ranged requests, want 2 and 6", whole, ranged)
	}
	hub.Token = ""
	if _, err := weights.Load(context.Background(), hub, ""); err == nil || !strings.Contains(err.Error(), "HF_TOKEN") {
		t.Errorf("without a token: %v, want an error naming HF_TOKEN", err)
	}
}

func TestBadInput(t *testing.T) {
	ctx := context.Background()
	write := func(t *testing.T, files map[string][]byte) string {
		dir := t.TempDir()
		for n, b := range files {
			if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	cfg := []byte(fittest.Llama31_8B().Config)
	header, err := weightstest.SafetensorsHeader([]fit.Tensor{{Name: "model.embed_tokens.weight", DType: "BF16", Shape: []uint64{128256, 4096}}})
	if err != nil {
		t.Fatal(err)
	}
	over := binary.LittleEndian.AppendUint64(nil, weights.MaxHeader+1)
	unknown := []byte(`{"w": {"dtype": "F7", "shape": [2], "data_offsets": [0, 2]}}`)
	unknown = append(binary.LittleEndian.AppendUint64(nil, uint64(len(unknown))), unknown...)
	for name, c := range map[string]struct {
		files map[string][]byte
		want  []string
	}{
		"no config.json":   {map[string][]byte{"model.safetensors": header}, []string{"no config.json"}},
		"truncated header": {map[string][]byte{"config.json": cfg, "model.safetensors": header[:len(header)/2]}, []string{"model.safetensors", "truncated header"}},
		"short file":       {map[string][]byte{"config.json": cfg, "model.safetensors": header[:5]}, []string{"model.safetensors", "truncated"}},
		"over the cap":     {map[string][]byte{"config.json": cfg, "model.safetensors": over}, []string{"model.safetensors", "over the 100 MiB cap"}},
		"unknown dtype":    {map[string][]byte{"config.json": cfg, "model.safetensors": unknown}, []string{"model.safetensors", `unknown dtype "F7"`}},
		"no weights":       {map[string][]byte{"config.json": cfg}, []string{"no model.safetensors"}},
		"bad config":       {map[string][]byte{"config.json": []byte(`{"hidden_size": 4096}`)}, []string{"config.json", "num_hidden_layers"}},
		"escaping index":   {map[string][]byte{"config.json": cfg, "model.safetensors.index.json": []byte(`{"weight_map": {"w": "../x.safetensors"}}`)}, []string{"weight_map", "../x.safetensors"}},
		"bad gguf":         {map[string][]byte{"m.gguf": []byte("GGUF\x03\x00\x00\x00\x01")}, []string{"m.gguf", "truncated header"}},
	} {
		t.Run(name, func(t *testing.T) {
			dir := write(t, c.files)
			_, err := weights.LoadPath(ctx, dir)
			for _, w := range c.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Fatalf("error %v, want one saying %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), dir) {
				t.Errorf("error %v does not name the directory %s", err, dir)
			}
		})
	}
}

func TestScan(t *testing.T) {
	dir := t.TempDir()
	if _, err := weightstest.WriteHubCache(dir, "meta-llama/Llama-3.1-8B", fittest.Llama31_8B(), 2); err != nil {
		t.Fatal(err)
	}
	if err := weightstest.WriteDir(filepath.Join(dir, "gemma-2-9b"), fittest.Gemma2_9B(), 1); err != nil {
		t.Fatal(err)
	}
	f := fittest.Llama31_8B_Q4KM()
	if err := weightstest.WriteGGUF(filepath.Join(dir, f.Dir), f); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "not-a-model"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := weights.Scan(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range got {
		names = append(names, c.Model)
		if c.Bytes == 0 {
			t.Errorf("%s: no size", c.Model)
		}
	}
	want := []string{f.Dir, "gemma-2-9b", "meta-llama/Llama-3.1-8B"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("scan found %v, want %v", names, want)
	}
	// The hub cache counts its blobs once (and its ref), not its links.
	var blobs uint64
	entries, _ := os.ReadDir(filepath.Join(dir, "models--meta-llama--Llama-3.1-8B", "blobs"))
	for _, e := range entries {
		info, _ := e.Info()
		blobs += uint64(info.Size())
	}
	ref, _ := os.Stat(filepath.Join(dir, "models--meta-llama--Llama-3.1-8B", "refs", "main"))
	if got[2].Bytes != blobs+uint64(ref.Size()) {
		t.Errorf("hub cache size %d, blobs and refs/main hold %d", got[2].Bytes, blobs+uint64(ref.Size()))
	}
	for model, ok := range map[string]bool{"meta-llama/Llama-3.1-8B": true, "gemma-2-9b": true, f.Dir: true, "../etc": false, "/etc": false, "x/../../y": false, "missing/model": false} {
		if _, found := weights.Find(dir, model); found != ok {
			t.Errorf("Find(%q) = %v, want %v", model, found, ok)
		}
	}
	if none, err := weights.Scan(filepath.Join(dir, "absent")); err != nil || len(none) != 0 {
		t.Errorf("a missing directory: %v, %v; want no models and no error", none, err)
	}
}

// ModelSize counts one model's own directory, an unfinished download's
// blobs included, and nothing of its neighbours: a starting engine watches
// its download grow without walking the whole cache.
func TestModelSizeGrowsWithADownload(t *testing.T) {
	dir := t.TempDir()
	if _, err := weightstest.WriteHubCache(dir, "meta-llama/Llama-3.1-8B", fittest.Llama31_8B(), 2); err != nil {
		t.Fatal(err)
	}
	if _, ok := weights.ModelSize(dir, "Qwen/Qwen3-8B"); ok {
		t.Fatal("a model not there has a size")
	}
	// The hub creates the model's directory and writes blobs as .incomplete.
	blobs := filepath.Join(dir, "hub", "models--Qwen--Qwen3-8B", "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	before, ok := weights.ModelSize(dir, "Qwen/Qwen3-8B")
	if !ok || before != 0 {
		t.Fatalf("an empty download: size %d, found %v; want 0, true", before, ok)
	}
	if err := os.WriteFile(filepath.Join(blobs, "abc.incomplete"), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	after, _ := weights.ModelSize(dir, "Qwen/Qwen3-8B")
	if after != 4096 {
		t.Fatalf("after 4096 bytes of a blob: size %d (its neighbour's files counted, or the blob not)", after)
	}
}
