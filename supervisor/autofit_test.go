package supervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/placement/fit"
	"github.com/llmgw/llmgw/placement/fit/fittest"
	"github.com/llmgw/llmgw/probes/weights/weightstest"
	"github.com/llmgw/llmgw/supervisor/status"
)

func placeRaw(t *testing.T, n *Node, body string) (int, status.DeploymentInfo, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", api(n, "/v1/deployments"), strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw json.RawMessage
	_ = json.NewDecoder(resp.Body).Decode(&raw)
	var info status.DeploymentInfo
	_ = json.Unmarshal(raw, &info)
	return resp.StatusCode, info, string(raw)
}

func expected(t *testing.T, f fittest.Family, r fit.Request) fit.Estimate {
	t.Helper()
	c, err := fit.ParseConfig([]byte(f.Config))
	if err != nil {
		t.Fatal(err)
	}
	p, err := fit.Analyze(fit.Model{Config: c, Tensors: f.Tensors}, "")
	if err != nil {
		t.Fatal(err)
	}
	e, err := p.Estimate(r)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// A node that has the model reports it; the node that accepts the place
// reads the headers from it over a signed hop, stores the figure in the
// spec, and placement prefers the node that has the weights.
func TestGPUMemoryAutoFromAPeer(t *testing.T) {
	h := newHarness(t)
	wdir := t.TempDir()
	if _, err := weightstest.WriteHubCache(wdir, "meta-llama/Llama-3.1-8B", fittest.Llama31_8B(), 2); err != nil {
		t.Fatal(err)
	}
	if err := weightstest.WriteDir(filepath.Join(wdir, "mixtral"), fittest.Mixtral8x7B(), 2); err != nil {
		t.Fatal(err)
	}
	h.config("a")
	cfg := h.config("b", h.gossipAddr("a"))
	cfg.WeightsDir = wdir
	cfg.GPUInterval = 100 * time.Millisecond
	h.cfgs["b"] = cfg
	b := h.start("b")
	a := h.start("a")
	testwait.Until(t, 15*time.Second, "a sees b's cached models", func() (bool, string) {
		for _, m := range a.cluster.Members() {
			if m.Name == "b" && m.Record != nil && len(m.Record.CachedModels) == 2 {
				return true, ""
			}
		}
		return false, fmt.Sprint(len(a.cluster.Members()), " members")
	})
	for _, m := range b.cluster.Local().CachedModels {
		if m.Bytes == 0 {
			t.Errorf("cached %s without a size", m.Model)
		}
	}

	code, info, raw := placeRaw(t, a, `{"name": "llama", "model": "meta-llama/Llama-3.1-8B", "engine": "fake", "gpu_memory": "auto", "max_model_len": 8192}`)
	if code != http.StatusOK {
		t.Fatalf("place: %d %s", code, raw)
	}
	// No max_num_seqs: sized for 16 sequences of 8192 tokens (16 GiB of KV
	// cache beside 15 GiB of weights fit an 80 GiB GPU), marked chosen.
	want := expected(t, fittest.Llama31_8B(), fit.Request{MaxModelLen: 8192, MaxNumSeqs: 16, Engine: "fake"})
	d := info.Deployment
	if d.Fit == nil || d.Fit.Source != "node b" || uint64(d.GPUMemory) < want.PerGPU.Total || uint64(d.GPUMemory) > want.PerGPU.Total+1<<20 ||
		d.MaxModelLen != 8192 || d.MaxNumSeqs != 16 || !d.Fit.SeqsChosen || d.Fit.KVBytesPerToken != 128<<10 {
		t.Fatalf("spec %+v (fit %+v), want gpu_memory %d from node b", d, d.Fit, want.PerGPU.Total)
	}
	testwait.Until(t, 15*time.Second, "llama placed on b, where its weights are", func() (bool, string) {
		for _, as := range a.Plan().Assignments {
			if as.Deployment == "llama" {
				return as.Node == "b" && as.MemoryPerGPU == uint64(d.GPUMemory), as.Node
			}
		}
		return false, "unplaced"
	})

	// Simulated GPUs read what the shard holds.
	testwait.Until(t, 15*time.Second, "b's GPU memory shows the shard's claim", func() (bool, string) {
		var used uint64
		for _, g := range b.cluster.Local().GPUs {
			used += g.MemoryUsed
		}
		return used == uint64(d.GPUMemory), fmt.Sprint(used)
	})

	// Mixtral (93 GB) on one 80 GiB GPU: refused with the numbers.
	code, _, raw = placeRaw(t, a, `{"name": "mix", "model": "mixtral", "engine": "fake", "gpu_memory": "auto", "max_model_len": 32768}`)
	if code != http.StatusBadRequest || !strings.Contains(raw, "needs 1 × ") || !strings.Contains(raw, "the largest is 80.0 GiB") {
		t.Fatalf("mixtral at TP 1: %d %s, want a refusal with the numbers", code, raw)
	}
	if slices.ContainsFunc(a.Status().Deployments(time.Now()), func(x status.DeploymentInfo) bool { return x.Name == "mix" }) {
		t.Fatal("a refused place left a deployment")
	}
	// A max_num_seqs no GPU holds: the field named, with the most that fit.
	code, _, raw = placeRaw(t, a, `{"name": "many", "model": "meta-llama/Llama-3.1-8B", "engine": "fake", "gpu_memory": "auto", "max_model_len": 32768, "max_num_seqs": 64}`)
	if code != http.StatusBadRequest || !strings.Contains(raw, "max_num_seqs 64: at most 15 sequences of 32768 tokens fit on one NVIDIA H100 80GB") {
		t.Fatalf("64 × 32768 tokens: %d %s, want a refusal naming max_num_seqs", code, raw)
	}
	// An explicit share is checked against the counts when the headers
	// are at hand (b has them).
	code, _, raw = placeRaw(t, a, `{"name": "many", "model": "meta-llama/Llama-3.1-8B", "engine": "fake", "gpu_memory": "24GiB", "max_model_len": 8192, "max_num_seqs": 64}`)
	if code != http.StatusBadRequest || !strings.Contains(raw, "max_num_seqs 64: gpu_memory 24GiB holds at most ") {
		t.Fatalf("64 × 8192 tokens in 24GiB: %d %s, want a refusal naming max_num_seqs", code, raw)
	}
	code, info, raw = placeRaw(t, a, `{"name": "few", "model": "meta-llama/Llama-3.1-8B", "engine": "fake", "gpu_memory": "24GiB", "max_model_len": 8192, "max_num_seqs": 2}`)
	if code != http.StatusOK || info.Deployment.MaxNumSeqs != 2 || info.Deployment.MaxModelLen != 8192 || info.Deployment.Fit != nil {
		t.Fatalf("2 × 8192 tokens in 24GiB: %d %s, want it kept as given", code, raw)
	}
	// tensor_parallel auto picks the smallest split that holds it.
	code, info, raw = placeRaw(t, a, `{"name": "mix", "model": "mixtral", "engine": "fake", "gpu_memory": "auto", "tensor_parallel": "auto", "max_model_len": 32768}`)
	if code != http.StatusOK || info.Deployment.TensorParallel != 2 {
		t.Fatalf("mixtral with tensor_parallel auto: %d %s, want TP 2", code, raw)
	}
}

func TestGPUMemoryAutoFromTheHub(t *testing.T) {
	dir := t.TempDir()
	f := fittest.Gemma2_9B()
	if err := weightstest.WriteDir(dir, f, 1); err != nil {
		t.Fatal(err)
	}
	var auth []string
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = append(auth, r.Header.Get("Authorization"))
		name, ok := strings.CutPrefix(r.URL.Path, "/google/gemma-2-9b/resolve/main/")
		if !ok {
			http.NotFound(w, r)
			return
		}
		http.ServeFile(w, r, filepath.Join(dir, filepath.Base(name)))
	}))
	defer hub.Close()
	h := newHarness(t)
	cfg := h.config("a")
	cfg.HubURL = hub.URL
	cfg.FitTimeout = 2 * time.Second
	h.cfgs["a"] = cfg
	a := h.start("a")
	testwait.Until(t, 15*time.Second, "a settled with its GPUs", func() (bool, string) {
		return len(a.cluster.Local().GPUs) == 4, ""
	})
	code, info, raw := placeRaw(t, a, `{"name": "gemma", "model": "google/gemma-2-9b", "engine": "fake", "gpu_memory": "auto", "max_num_seqs": 4, "env": {"HF_TOKEN": "hf_x"}}`)
	if code != http.StatusOK {
		t.Fatalf("place: %d %s", code, raw)
	}
	want := expected(t, f, fit.Request{MaxNumSeqs: 4, Engine: "fake"})
	if d := info.Deployment; d.Fit == nil || !strings.HasPrefix(d.Fit.Source, hub.URL) || d.Fit.KVCache != want.PerGPU.KVCache || d.MaxModelLen != 8192 {
		t.Fatalf("spec %+v fit %+v, want the KV for 4 × 8192 tokens (%d) from the hub", d, d.Fit, want.PerGPU.KVCache)
	}
	if len(auth) == 0 || auth[0] != "Bearer hf_x" {
		t.Errorf("hub saw authorization %q, want the deployment's HF_TOKEN", auth)
	}

	// Nowhere to read a model from: a clear error, fast, nothing placed.
	hub.Close()
	start := time.Now()
	code, _, raw = placeRaw(t, a, `{"name": "other", "model": "org/absent", "engine": "fake", "gpu_memory": "auto"}`)
	if code != http.StatusBadRequest || !strings.Contains(raw, "cannot read the model's headers") || !strings.Contains(raw, "no other node reports it cached") {
		t.Fatalf("unreadable model: %d %s", code, raw)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the refusal took %s", d)
	}
	code, _, raw = placeRaw(t, a, `{"name": "other", "model": "org/m", "engine": "fake", "tensor_parallel": "auto"}`)
	if code != http.StatusBadRequest || !strings.Contains(raw, "tensor_parallel: auto needs gpu_memory: auto") {
		t.Fatalf("tensor_parallel auto alone: %d %s", code, raw)
	}
}

// The headers endpoint hands out only what the weights dir holds, only to
// the token or a hop signed for it.
func TestWeightsHeadersNeedsTheTokenOrAHop(t *testing.T) {
	h := newHarness(t)
	wdir := t.TempDir()
	if err := weightstest.WriteDir(filepath.Join(wdir, "gemma"), fittest.Gemma2_9B(), 1); err != nil {
		t.Fatal(err)
	}
	cfg := h.config("a")
	cfg.WeightsDir = wdir
	h.cfgs["a"] = cfg
	a := h.start("a")
	url := api(a, "/v1/weights/headers?model=gemma")
	var m fit.Model
	if code := call(t, "GET", url, testToken, nil, &m); code != http.StatusOK || len(m.Tensors) != len(fittest.Gemma2_9B().Tensors) || m.Config.NumLayers != 42 {
		t.Fatalf("with the token: %d, %d tensors", code, len(m.Tensors))
	}
	if code := call(t, "GET", url, "", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("without the token: %d, want 401", code)
	}
	req, _ := http.NewRequest("GET", url, nil)
	a.hops.sign(req, "mcp", "x", nil) // signed for another purpose
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a hop signed for mcp: %d, want 403", resp.StatusCode)
	}
	for _, model := range []string{"../" + filepath.Base(wdir), "/etc", "absent"} {
		if code := call(t, "GET", api(a, "/v1/weights/headers?model="+model), testToken, nil, nil); code != http.StatusNotFound {
			t.Errorf("model %q: %d, want 404", model, code)
		}
	}
}

// shareHolds names the field to lower and the largest that fits: the
// count when fewer sequences fit, the context when not one does.
func TestShareHolds(t *testing.T) {
	f := fittest.Llama31_8B()
	c, err := fit.ParseConfig([]byte(f.Config))
	if err != nil {
		t.Fatal(err)
	}
	p, err := fit.Analyze(fit.Model{Config: c, Tensors: f.Tensors}, "")
	if err != nil {
		t.Fatal(err)
	}
	d := placement.Deployment{Name: "x", Model: "m", Engine: "vllm", TensorParallel: 1, PipelineParallel: 1, GPUMemory: 24 << 30}
	for _, c := range []struct {
		seqs, ctx int
		want      string
	}{
		{2, 8192, ""},
		{64, 8192, "max_num_seqs 64: gpu_memory 24GiB holds at most 4 sequences of 8192 tokens"},
		{0, 65536, "max_model_len 65536: gpu_memory 24GiB holds at most "},
		{2, 0, "max_model_len 131072: gpu_memory 24GiB holds at most "},
	} {
		d.MaxNumSeqs, d.MaxModelLen = c.seqs, c.ctx
		err := shareHolds(p, d, "local")
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, placement.ErrInvalidDeployment)) {
			t.Errorf("%d × %d tokens in 24GiB: %v, want %q", c.seqs, c.ctx, err, c.want)
		}
	}
}
