package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/protocol"
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
		return d, n.checkShare(ctx, d)
	}
	refuse := func(format string, args ...any) (placement.Deployment, error) {
		return d, fmt.Errorf("%w: gpu_memory auto for %s: "+format, append([]any{placement.ErrInvalidDeployment, d.Model}, args...)...)
	}
	ctx, cancel := n.fitContext(ctx)
	defer cancel()
	m, source, err := n.modelHeaders(ctx, d, true)
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
		MaxModelLen: d.MaxModelLen, MaxNumSeqs: d.MaxNumSeqs, Engine: d.Engine, MaxLoras: d.MaxLoras, MaxLoraRank: d.MaxLoraRank}
	if d.TensorParallelAuto {
		if req.TensorParallel, _, err = prof.ChooseTP(req, kinds); err != nil {
			return refuse("%s: %v", source, err)
		}
	}
	e, err := prof.Estimate(req)
	if err != nil {
		return refuse("%s: %v", source, err)
	}
	// Without max_num_seqs the KV cache is sized for as many full-context
	// sequences as the GPU type this split is sized for holds, up to
	// fit.DefaultMaxSeqs: a cap of 1 made vLLM and SGLang serve one
	// request at a time. When not even one fits, e (one sequence) stays,
	// for the refusal below to show.
	seqsChosen := false
	if d.MaxNumSeqs == 0 {
		if k, ok := fit.SizedFor(kinds, e.Request.TensorParallel); ok {
			if seqs := prof.ChooseSeqs(e.Request, k); seqs > 0 {
				more := e.Request
				more.MaxNumSeqs = seqs
				if e, err = prof.Estimate(more); err != nil {
					return refuse("%s: %v", source, err)
				}
				seqsChosen = true
			}
		}
	}
	b := e.PerGPU
	need := fmt.Sprintf("needs %d × %s at TP %d with %d × %d tokens of context (%s weights + %s KV cache + %s overhead)",
		e.Request.TensorParallel, fit.GiB(b.Total), e.Request.TensorParallel, e.Request.MaxNumSeqs, e.Request.MaxModelLen,
		fit.GiB(b.Weights), fit.GiB(b.KVCache), fit.GiB(b.Framework+b.Activations+b.CUDAGraphs+b.LoRA))
	if !slices.ContainsFunc(kinds, func(k fit.GPUKind) bool { return k.Holds(e) }) {
		big := kinds[0]
		hint := fmt.Sprintf("at most %d tokens of context fit on one", prof.MaxModelLen(req, big.MemoryBytes))
		if strings.HasPrefix(hint, "at most 0 ") {
			hint = "the weights and overhead alone do not fit on one"
		}
		if d.TensorParallelAuto {
			hint = fmt.Sprintf("no split up to the %d GPU(s) one node has is enough", big.PerNode)
		}
		// A count the user gave is what to lower when fewer sequences
		// fit: named, with the most that fit on the largest GPU type
		// that has GPUs enough for the split.
		if k, ok := fit.SizedFor(kinds, e.Request.TensorParallel); ok && d.MaxNumSeqs > 0 && !d.TensorParallelAuto {
			if most := prof.MaxSeqs(e.Request, k.MemoryBytes); most > 0 {
				hint = fmt.Sprintf("max_num_seqs %d: at most %d sequences of %d tokens fit on one %s (%s) at TP %d; lower max_num_seqs or max_model_len",
					d.MaxNumSeqs, most, e.Request.MaxModelLen, k.Name, fit.GiB(k.MemoryBytes), e.Request.TensorParallel)
			}
		}
		return refuse("%s; no GPU type in the cluster could ever hold that: the largest is %s (%s, %d on %s); %s",
			need, fit.GiB(big.MemoryBytes), big.Name, big.PerNode, big.Node, hint)
	}
	d.GPUMemoryAuto, d.TensorParallelAuto = false, false
	d.TensorParallel = e.Request.TensorParallel
	d.MaxModelLen, d.MaxNumSeqs = e.Request.MaxModelLen, e.Request.MaxNumSeqs
	// Whole MiB, rounded up: the spec reads as a size, not a byte count.
	d.GPUMemory = placement.Bytes((b.Total + 1<<20 - 1) &^ (1<<20 - 1))
	// The mark is protocol 3's (internal/protocol.V3): below it the
	// chosen count is stored as a plain cap that every agent passes on.
	if seqsChosen && n.cluster.ActiveVersion() < protocol.V3 {
		seqsChosen = false
	}
	d.Fit = &placement.Fit{Params: prof.Weights.Params, WeightsBytes: prof.Weights.Bytes, KVBytesPerToken: prof.KVBytesPerToken + prof.SlidingKVBytesPerToken,
		Weights: b.Weights, KVCache: b.KVCache, Overhead: b.Framework + b.Activations + b.CUDAGraphs + b.LoRA, Source: source, SeqsChosen: seqsChosen}
	n.log.Info("gpu_memory auto", "deployment", d.Name, "model", d.Model, "from", source, "per_gpu", d.GPUMemory.String(),
		"tensor_parallel", d.TensorParallel, "max_model_len", d.MaxModelLen, "max_num_seqs", d.MaxNumSeqs, "max_num_seqs_chosen", seqsChosen)
	return d, nil
}

// checkShare refuses an explicit gpu_memory that cannot hold the
// max_model_len × max_num_seqs the spec asks of the engine (vLLM would
// refuse to start, or start with less KV cache than one full sequence),
// with the field to change and the largest that fits. It is checked only
// when the model's headers are at hand, in this node's weights dir or on a
// node that reports the model cached: a place with an explicit share must
// not wait on the hub. A model the fit arithmetic cannot size is not
// checked either; the engine then says what is wrong.
func (n *Node) checkShare(ctx context.Context, d placement.Deployment) error {
	if d.GPUMemory == 0 || (d.MaxModelLen == 0 && d.MaxNumSeqs == 0) {
		return nil
	}
	ctx, cancel := n.fitContext(ctx)
	defer cancel()
	m, source, err := n.modelHeaders(ctx, d, false)
	if err != nil {
		n.log.Debug("gpu_memory not checked against max_model_len and max_num_seqs", "deployment", d.Name, "err", err)
		return nil
	}
	prof, err := fit.Analyze(m, kvCacheDType(d.Args))
	if err != nil {
		n.log.Debug("gpu_memory not checked against max_model_len and max_num_seqs", "deployment", d.Name, "from", source, "err", err)
		return nil
	}
	return shareHolds(prof, d, source)
}

// shareHolds is checkShare's arithmetic: d's share must hold the weights,
// the KV cache of max_num_seqs (1 when unset) sequences of max_model_len
// tokens (the model's own when unset) and the overhead, per GPU.
func shareHolds(prof fit.Profile, d placement.Deployment, source string) error {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format+" (model %s, read from %s)", append(append([]any{placement.ErrInvalidDeployment}, args...), d.Model, source)...)
	}
	share := uint64(d.GPUMemory)
	req := fit.Request{TensorParallel: d.TensorParallel, PipelineParallel: d.PipelineParallel,
		MaxModelLen: d.MaxModelLen, MaxNumSeqs: d.MaxNumSeqs, Engine: d.Engine, MaxLoras: d.MaxLoras, MaxLoraRank: d.MaxLoraRank}
	e, err := prof.Estimate(req)
	if err != nil {
		return refuse("%v", err)
	}
	if e.PerGPU.Total <= share {
		return nil
	}
	r, b := e.Request, e.PerGPU
	need := fmt.Sprintf("%d × %d tokens need %s per GPU at TP %d (%s weights + %s KV cache + %s overhead)",
		r.MaxNumSeqs, r.MaxModelLen, fit.GiB(b.Total), r.TensorParallel, fit.GiB(b.Weights), fit.GiB(b.KVCache), fit.GiB(b.Framework+b.Activations+b.CUDAGraphs+b.LoRA))
	// Whole MiB, rounded up, as gpu_memory: auto stores its figure.
	raise := fmt.Sprintf("or raise gpu_memory to at least %s", placement.Bytes((b.Total+1<<20-1)&^(1<<20-1)))
	if d.MaxNumSeqs > 0 {
		if most := prof.MaxSeqs(r, share); most > 0 {
			return refuse("max_num_seqs %d: gpu_memory %s holds at most %d sequences of %d tokens; %s; lower max_num_seqs to %d %s",
				d.MaxNumSeqs, d.GPUMemory, most, r.MaxModelLen, need, most, raise)
		}
	}
	if most := prof.MaxModelLen(r, share); most > 0 {
		// Without max_model_len it is the model's own context that does
		// not fit: the fix is still a shorter max_model_len.
		return refuse("max_model_len %d: gpu_memory %s holds at most %d tokens of context for %d sequence(s); %s; give max_model_len %d or less %s",
			r.MaxModelLen, d.GPUMemory, most, r.MaxNumSeqs, need, most, raise)
	}
	return refuse("gpu_memory %s: not even one token of context fits beside the weights and overhead; %s; raise gpu_memory", d.GPUMemory, need)
}

// fitContext bounds the read of a model's headers for a place by
// Config.FitTimeout (defaultFitTimeout when unset).
func (n *Node) fitContext(ctx context.Context) (context.Context, context.CancelFunc) {
	timeout := n.cfg.FitTimeout
	if timeout <= 0 {
		timeout = defaultFitTimeout
	}
	return context.WithTimeout(ctx, timeout)
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
// that reports it cached, or (with hub) the hub. The error says what each
// said.
func (n *Node) modelHeaders(ctx context.Context, d placement.Deployment, hub bool) (fit.Model, string, error) {
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
	case !hub:
		tried = append(tried, "the hub is not asked for this")
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
