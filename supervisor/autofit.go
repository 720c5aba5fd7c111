package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/placement/fit"
	"github.com/llmgw/llmgw/probes/weights"
)

// gpu_memory: auto. The node that accepts the place reads the model's
// headers (its own weights dir first, then a node that reports the model
// cached, then the hub), computes the per-GPU figure with placement/fit
// once, and stores it in the spec: every node then places the same spec,
// and placement stays pure. A model that no GPU type in the cluster could
// hold, even empty, is refused here with the numbers.

const defaultFitTimeout = 5 * time.Second

// fitNodes is the cluster's GPUs as placement/fit sizes for them: the
// nodes that count (alive or suspect, with a record).
func fitNodes(members []gossip.Member) []fit.NodeGPUs {
	var nodes []fit.NodeGPUs
	for _, m := range members {
		if m.Record == nil || (m.State != gossip.StateAlive && m.State != gossip.StateSuspect) {
			continue
		}
		n := fit.NodeGPUs{Node: m.Name}
		for _, g := range m.Record.GPUs {
			n.GPUs = append(n.GPUs, fit.GPU{Name: g.Name, MemoryBytes: g.MemoryTotal, MIG: g.MIG})
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// resolveAuto turns a gpu_memory: auto spec into one with the figures.
// Errors wrap placement.ErrInvalidDeployment: the request, not the node,
// is what cannot be served.
func (n *Node) resolveAuto(ctx context.Context, d placement.Deployment) (placement.Deployment, error) {
	if !d.GPUMemoryAuto {
		if d.TensorParallelAuto {
			return d, fmt.Errorf("%w: tensor_parallel: auto needs gpu_memory: auto (the smallest split is chosen from the model's size)", placement.ErrInvalidDeployment)
		}
		return d, nil
	}
	refuse := func(format string, args ...any) (placement.Deployment, error) {
		return d, fmt.Errorf("%w: gpu_memory auto for %s: "+format, append([]any{placement.ErrInvalidDeployment, d.Model}, args...)...)
	}
	timeout := n.cfg.FitTimeout
	if timeout <= 0 {
		timeout = defaultFitTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	m, source, err := n.modelHeaders(ctx, d)
	if err != nil {
		return refuse("%v", err)
	}
	prof, err := fit.Analyze(m, kvCacheDType(d.Args))
	if err != nil {
		return refuse("%s: %v", source, err)
	}
	kinds := fit.Kinds(fitNodes(n.cluster.Members()), d.GPUType)
	if len(kinds) == 0 {
		return refuse("no GPU in the cluster%s to size it for", typeClause(d.GPUType))
	}
	req := fit.Request{TensorParallel: d.TensorParallel, PipelineParallel: d.PipelineParallel,
		MaxModelLen: d.MaxModelLen, MaxNumSeqs: d.MaxNumSeqs, Engine: d.Engine}
	if d.TensorParallelAuto {
		if req.TensorParallel, _, err = prof.ChooseTP(req, kinds); err != nil {
			return refuse("%s: %v", source, err)
		}
	}
	e, err := prof.Estimate(req)
	if err != nil {
		return refuse("%s: %v", source, err)
	}
	b := e.PerGPU
	need := fmt.Sprintf("needs %d × %s at TP %d with %d × %d tokens of context (%s weights + %s KV cache + %s overhead)",
		e.Request.TensorParallel, fit.GiB(b.Total), e.Request.TensorParallel, e.Request.MaxNumSeqs, e.Request.MaxModelLen,
		fit.GiB(b.Weights), fit.GiB(b.KVCache), fit.GiB(b.Framework+b.Activations+b.CUDAGraphs))
	if !slices.ContainsFunc(kinds, func(k fit.GPUKind) bool { return k.Holds(e) }) {
		big := kinds[0]
		hint := fmt.Sprintf("at most %d tokens of context fit on one", prof.MaxModelLen(req, big.MemoryBytes))
		if strings.HasPrefix(hint, "at most 0 ") {
			hint = "the weights and overhead alone do not fit on one"
		}
		if d.TensorParallelAuto {
			hint = fmt.Sprintf("no split up to the %d GPU(s) one node has is enough", big.PerNode)
		}
		return refuse("%s; no GPU type in the cluster could ever hold that: the largest is %s (%s, %d on %s); %s",
			need, fit.GiB(big.MemoryBytes), big.Name, big.PerNode, big.Node, hint)
	}
	d.GPUMemoryAuto, d.TensorParallelAuto = false, false
	d.TensorParallel = e.Request.TensorParallel
	d.MaxModelLen, d.MaxNumSeqs = e.Request.MaxModelLen, e.Request.MaxNumSeqs
	// Whole MiB, rounded up: the spec reads as a size, not a byte count.
	d.GPUMemory = placement.Bytes((b.Total + 1<<20 - 1) &^ (1<<20 - 1))
	d.Fit = &placement.Fit{Params: prof.Weights.Params, WeightsBytes: prof.Weights.Bytes, KVBytesPerToken: prof.KVBytesPerToken + prof.SlidingKVBytesPerToken,
		Weights: b.Weights, KVCache: b.KVCache, Overhead: b.Framework + b.Activations + b.CUDAGraphs, Source: source}
	n.log.Info("gpu_memory auto", "deployment", d.Name, "model", d.Model, "from", source, "per_gpu", d.GPUMemory.String(),
		"tensor_parallel", d.TensorParallel, "max_model_len", d.MaxModelLen, "max_num_seqs", d.MaxNumSeqs)
	return d, nil
}

// typeClause names the gpu_type a refusal was limited to, if any.
func typeClause(t string) string {
	if t == "" {
		return ""
	}
	return fmt.Sprintf(" matching gpu_type %q", t)
}

// kvCacheDType reads --kv-cache-dtype from an engine's args ("" when not
// given): an fp8 cache halves the KV figure.
func kvCacheDType(args []string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--kv-cache-dtype="); ok {
			return v
		}
		if a == "--kv-cache-dtype" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// modelHeaders finds the model's headers: this node's weights dir, a node
// that reports it cached, or the hub. The error says what each said.
func (n *Node) modelHeaders(ctx context.Context, d placement.Deployment) (fit.Model, string, error) {
	var tried []string
	if path, ok := weights.Find(n.cfg.WeightsDir, d.Model); ok {
		n.RescanWeights()
		m, err := weights.LoadPath(ctx, path)
		if err == nil {
			return m, "local " + path, nil
		}
		return fit.Model{}, "", err
	}
	if n.cfg.WeightsDir == "" {
		tried = append(tried, "this node has no --weights-dir")
	} else {
		tried = append(tried, "not in "+n.cfg.WeightsDir)
	}
	peers := 0
	for _, m := range n.cluster.Members() {
		if m.Record == nil || m.Name == n.cfg.Name || m.State != gossip.StateAlive {
			continue
		}
		if !slices.ContainsFunc(m.Record.CachedModels, func(c gossip.CachedModel) bool { return c.Model == d.Model }) {
			continue
		}
		peers++
		got, err := n.peerHeaders(ctx, m.Record.API, d.Model)
		if err == nil {
			return got, "node " + m.Name, nil
		}
		tried = append(tried, fmt.Sprintf("node %s: %v", m.Name, err))
	}
	if peers == 0 {
		tried = append(tried, "no other node reports it cached")
	}
	switch {
	case n.cfg.HubURL == "":
		tried = append(tried, "no --hub-url")
	case !weights.ValidRepo(d.Model):
		tried = append(tried, "not a hub id (ORG/NAME)")
	default:
		hub := &weights.Hub{Base: n.cfg.HubURL, Repo: d.Model, Token: d.Env["HF_TOKEN"]}
		m, err := weights.Load(ctx, hub, "")
		if err == nil {
			return m, hub.Where(), nil
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%s did not answer in time", hub.Where())
		}
		tried = append(tried, "hub: "+err.Error())
	}
	return fit.Model{}, "", fmt.Errorf("cannot read the model's headers: %s", strings.Join(tried, "; "))
}
