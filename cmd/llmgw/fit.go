package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/placement/fit"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/probes/weights"
)

// fitCommand is `llmgw fit`: what a model needs per GPU, from its own
// headers, and what each GPU type of the cluster buys with it.
func fitCommand() *cli.Command {
	flags := append(jsonClientFlags(),
		&cli.StringFlag{Name: "tp", Value: "1", Usage: "tensor parallel size, or auto: the smallest that fits each GPU type"},
		&cli.IntFlag{Name: "pp", Value: 1, Usage: "pipeline parallel size"},
		&cli.IntFlag{Name: "max-model-len", Usage: "context per sequence (default: the model's own)"},
		&cli.IntFlag{Name: "max-num-seqs", Usage: "concurrent full-context sequences (default: as place --gpu-memory auto chooses, at most 16 that the largest GPU type holds; 1 without a GPU type)"},
		&cli.IntFlag{Name: "max-loras", HideDefault: true, Usage: "LoRA adapter slots, as place --max-loras: their buffers count in the figure"},
		&cli.IntFlag{Name: "max-lora-rank", HideDefault: true, Usage: "the largest adapter rank, as place --max-lora-rank (default 16)"},
		&cli.StringFlag{Name: "engine", Value: "vllm", Usage: "engine whose overhead to count: vllm, sglang, llamacpp"},
		&cli.StringFlag{Name: "kv-cache-dtype", Usage: "KV cache dtype (default: the model's; fp8 halves it)"},
		&cli.StringSliceFlag{Name: "gpu", Usage: "GPU type(s) to size for, e.g. H100-80GB (default: the cluster's, from --addr)"},
		&cli.StringFlag{Name: "hub-url", Value: weights.DefaultHub, Usage: "hub to read a model id's headers from by range requests (HF_TOKEN from the environment)", Sources: cli.EnvVars("LLMGW_HUB_URL")},
	)
	return &cli.Command{
		Name:      "fit",
		Usage:     "how much GPU memory a model needs, from its config and weight headers only",
		ArgsUsage: "MODEL_OR_DIR",
		Flags:     flags,
		Action: func(ctx context.Context, c *cli.Command) error {
			if c.Args().Len() != 1 {
				return usageError("MODEL_OR_DIR: want one model directory, .gguf file or hub id (ORG/NAME)")
			}
			tpAuto := c.String("tp") == "auto"
			tp := 0
			if !tpAuto {
				var err error
				if tp, err = strconv.Atoi(c.String("tp")); err != nil || tp < 1 || tp > fit.MaxTensorParallel {
					return usageError(fmt.Sprintf("--tp %q: want 1 to %d or auto", c.String("tp"), fit.MaxTensorParallel))
				}
			}
			kinds, none, err := fitGPUs(ctx, c)
			if err != nil {
				return err
			}
			m, err := fitModel(ctx, c, c.Args().First())
			if err != nil {
				return failure(err.Error())
			}
			prof, err := fit.Analyze(m, c.String("kv-cache-dtype"))
			if err != nil {
				return failure(fmt.Sprintf("%s: %v", m.Name, err))
			}
			if c.IsSet("max-num-seqs") && c.Int("max-num-seqs") < 1 {
				return usageError(fmt.Sprintf("--max-num-seqs %d: want 1 or more (or leave it out: as place chooses)", c.Int("max-num-seqs")))
			}
			req := fit.Request{TensorParallel: max(tp, 1), PipelineParallel: int(c.Int("pp")), MaxModelLen: int(c.Int("max-model-len")),
				MaxNumSeqs: int(c.Int("max-num-seqs")), Engine: c.String("engine"), MaxLoras: int(c.Int("max-loras")), MaxLoraRank: int(c.Int("max-lora-rank"))}
			if req.MaxNumSeqs == 0 {
				req.MaxNumSeqs = chosenSeqs(prof, req, kinds)
			}
			rep, err := fitReport(prof, req, tpAuto, kinds)
			if err != nil {
				return failure(err.Error())
			}
			if c.Bool("json") {
				if none != "" {
					// stdout carries only the JSON.
					fmt.Fprintln(c.Root().ErrWriter, none)
				}
				return printJSON(c.Root().Writer, rep)
			}
			return printFit(c.Root().Writer, prof, rep, none)
		},
	}
}

// noGPUHint ends what fit says when it has no GPU type to compare with.
const noGPUHint = "name a GPU with --gpu or point --addr at a node to compare"

// fitGPUs is --gpu, or else the GPU types the cluster at --addr reports.
// With neither, kinds is empty and none says why: a model's needs are
// worth printing without a cluster. A node named by --addr (or
// LLMGW_ADDR) that does not answer, or any node that answers with an
// error, is an error.
func fitGPUs(ctx context.Context, c *cli.Command) (kinds []fit.GPUKind, none string, err error) {
	for _, spec := range c.StringSlice("gpu") {
		gs, err := gpu.ParseSimulated("1x"+spec, "fit")
		if err != nil {
			return nil, "", usageError(fmt.Sprintf("--gpu %q: want <model>-<memory>GB, e.g. H100-80GB", spec))
		}
		kinds = append(kinds, fit.GPUKind{Name: gs[0].Name, MemoryBytes: gs[0].MemoryTotal})
	}
	if len(kinds) > 0 {
		return kinds, "", nil
	}
	cl, err := newClient(c)
	if err != nil {
		return nil, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ci, err := cl.cluster(ctx)
	if err != nil {
		// Only a default address with nothing there is "no cluster": a
		// node that answers with an error is one, and the error stands.
		var unreachable *url.Error
		if c.IsSet("addr") || !errors.As(err, &unreachable) {
			return nil, "", fmt.Errorf("%w (or name the GPU with --gpu H100-80GB)", err)
		}
		return nil, fmt.Sprintf("no GPU to compare with: no node answers at %s; %s", cl.base, noGPUHint), nil
	}
	var nodes []fit.NodeGPUs
	for _, m := range ci.Members {
		if m.State != gossip.StateAlive && m.State != gossip.StateSuspect {
			continue
		}
		n := fit.NodeGPUs{Node: m.Name}
		for _, g := range m.GPUs {
			n.GPUs = append(n.GPUs, fit.GPU{Name: g.Name, MemoryBytes: g.MemoryTotal, MIG: g.MIG})
		}
		nodes = append(nodes, n)
	}
	if kinds = fit.Kinds(nodes, ""); len(kinds) == 0 {
		return nil, fmt.Sprintf("no GPU to compare with: the cluster at %s reports none; %s", cl.base, noGPUHint), nil
	}
	return kinds, "", nil
}

// fitModel reads the headers: a local path, else the hub.
func fitModel(ctx context.Context, c *cli.Command, arg string) (fit.Model, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := os.Stat(arg); err == nil {
		return weights.LoadPath(ctx, arg)
	}
	if m, ok := clusterHeaders(ctx, c, arg); ok {
		return m, nil
	}
	if !weights.ValidRepo(arg) {
		return fit.Model{}, fmt.Errorf("%s: no such file or directory, no node reports it cached, and not a hub id (ORG/NAME)", arg)
	}
	if c.String("hub-url") == "" {
		return fit.Model{}, fmt.Errorf("%s: not a local path, and --hub-url is empty", arg)
	}
	hub := &weights.Hub{Base: c.String("hub-url"), Repo: arg, Token: os.Getenv("HF_TOKEN")}
	m, err := weights.Load(ctx, hub, "")
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%s did not answer within 10s", hub.Where())
	}
	m.Name = arg
	return m, err
}

// clusterHeaders asks a node that reports model cached for its headers,
// with the token (the node's /v1/weights/headers needs it). Any failure
// falls through to the hub: ok is false.
func clusterHeaders(ctx context.Context, c *cli.Command, model string) (fit.Model, bool) {
	cl, err := newClient(c)
	if err != nil || cl.token == "" {
		return fit.Model{}, false
	}
	ci, err := cl.cluster(ctx)
	if err != nil {
		return fit.Model{}, false
	}
	for _, m := range ci.Members {
		if m.State != gossip.StateAlive || m.API == "" || !slices.ContainsFunc(m.CachedModels, func(x gossip.CachedModel) bool { return x.Model == model }) {
			continue
		}
		at := &client{base: "http://" + m.API, token: cl.token, http: cl.http}
		var got fit.Model
		if at.do(ctx, "GET", "/v1/weights/headers?model="+url.QueryEscape(model), nil, "", &got) == nil {
			return got, true
		}
	}
	return fit.Model{}, false
}

// fitResult is `llmgw fit --json`.
type fitResult struct {
	Model           string        `json:"model"`
	Format          string        `json:"format"`
	Params          uint64        `json:"params"`
	WeightsBytes    uint64        `json:"weights_bytes"`
	KVBytesPerToken uint64        `json:"kv_bytes_per_token"`
	SlidingKV       uint64        `json:"sliding_kv_bytes_per_token,omitempty"`
	SlidingWindow   int           `json:"sliding_window,omitempty"`
	Attention       string        `json:"attention"`
	PerGPUBytes     uint64        `json:"per_gpu_bytes"`
	MaxModelLen     int           `json:"max_model_len"`
	MaxNumSeqs      int           `json:"max_num_seqs"`
	MaxLoras        int           `json:"max_loras,omitempty"`
	MaxLoraRank     int           `json:"max_lora_rank,omitempty"`
	TensorParallel  int           `json:"tensor_parallel"`
	Pipeline        int           `json:"pipeline_parallel"`
	PerGPU          fit.Breakdown `json:"per_gpu"`
	GPUs            []fit.GPUFit  `json:"gpus"`
}

func fitReport(p fit.Profile, req fit.Request, tpAuto bool, kinds []fit.GPUKind) (fitResult, error) {
	e, err := p.Estimate(req)
	if err != nil {
		return fitResult{}, err
	}
	r := fitResult{Model: p.Model, Format: p.Format, Params: p.Weights.Params, WeightsBytes: p.Weights.Bytes,
		KVBytesPerToken: p.KVBytesPerToken, SlidingKV: p.SlidingKVBytesPerToken, SlidingWindow: p.SlidingWindow,
		Attention: p.Attention, PerGPUBytes: e.PerGPU.Total, MaxModelLen: e.Request.MaxModelLen, MaxNumSeqs: e.Request.MaxNumSeqs,
		TensorParallel: e.Request.TensorParallel, Pipeline: e.Request.PipelineParallel, PerGPU: e.PerGPU, GPUs: []fit.GPUFit{},
		MaxLoras: e.Request.MaxLoras, MaxLoraRank: e.Request.MaxLoraRank}
	for _, k := range kinds {
		r.GPUs = append(r.GPUs, p.OnKind(e, k, tpAuto))
	}
	return r, nil
}

// printFit writes the needs, then a row per GPU type, or none (why there
// is no GPU to compare with) in place of the table.
func printFit(w io.Writer, p fit.Profile, r fitResult, none string) error {
	gb := func(b uint64) string { return fmt.Sprintf("%.2f GB (%s)", float64(b)/1e9, fit.GiB(b)) }
	fmt.Fprintf(w, "model       %s (%s, %s, %d layers)\n", r.Model, r.Format, p.Config.ModelType, p.Config.NumLayers)
	fmt.Fprintf(w, "params      %.2f B\n", float64(r.Params)/1e9)
	var dts []string
	for dt, b := range p.Weights.ByDType {
		dts = append(dts, fmt.Sprintf("%s %s", dt, fit.GiB(b)))
	}
	slices.Sort(dts)
	fmt.Fprintf(w, "weights     %s: %s\n", gb(r.WeightsBytes), strings.Join(dts, ", "))
	kv := fmt.Sprintf("%s per token (%s)", kib(r.KVBytesPerToken), r.Attention)
	if r.SlidingKV > 0 {
		kv += fmt.Sprintf(" + %s per token in sliding-window layers, up to %d tokens", kib(r.SlidingKV), r.SlidingWindow)
	}
	fmt.Fprintf(w, "kv cache    %s\n", kv)
	b := r.PerGPU
	fmt.Fprintf(w, "per GPU     TP %d, PP %d, %d × %d tokens: %s weights + %s KV cache + %s framework + %s activations + %s CUDA graphs = %s\n\n",
		r.TensorParallel, r.Pipeline, r.MaxNumSeqs, r.MaxModelLen, fit.GiB(b.Weights), fit.GiB(b.KVCache),
		fit.GiB(b.Framework), fit.GiB(b.Activations), fit.GiB(b.CUDAGraphs), fit.GiB(b.Total))
	if b.LoRA > 0 {
		fmt.Fprintf(w, "lora        %s of adapter slots per GPU, in the total (%d × rank %d); %s of host memory for vLLM's CPU cache of as many adapters\n\n",
			fit.GiB(b.LoRA), r.MaxLoras, cmp.Or(r.MaxLoraRank, placement.DefaultLoraRank), fit.GiB(b.LoRACPU))
	}
	if none != "" {
		_, err := fmt.Fprintln(w, none)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tMEMORY\tTP\tPER GPU\tFITS\tMAX CONTEXT\tFULL-CONTEXT SEQS\tWHY NOT")
	for _, g := range r.GPUs {
		fits := "no"
		if g.Fits {
			fits = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\n", strings.TrimPrefix(g.Name, "NVIDIA "), fit.GiB(g.MemoryBytes), g.TensorParallel,
			fit.GiB(g.PerGPUBytes), fits, g.MaxModelLen, g.MaxNumSeqs, orDash(g.Why))
	}
	return tw.Flush()
}

func kib(b uint64) string { return fmt.Sprintf("%.1f KiB", float64(b)/1024) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// cachedSummary writes a node's cached models for `llmgw nodes`: the first
// few names and their total size.
func cachedSummary(ms []gossip.CachedModel) string {
	if len(ms) == 0 {
		return "-"
	}
	var names []string
	var total uint64
	for i, m := range ms {
		total += m.Bytes
		if i < 3 {
			names = append(names, m.Model)
		}
	}
	s := strings.Join(names, ",")
	if len(ms) > 3 {
		s += fmt.Sprintf(" +%d", len(ms)-3)
	}
	return s + " (" + humanBytes(total) + ")"
}

// humanBytes is a size in the largest binary unit under it, one decimal.
func humanBytes(b uint64) string {
	for _, u := range []struct {
		name string
		size uint64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b >= u.size {
			return fmt.Sprintf("%.1f %s", float64(b)/float64(u.size), u.name)
		}
	}
	return fmt.Sprintf("%d B", b)
}

// chosenSeqs is the concurrency a `place --gpu-memory auto` without
// max_num_seqs would size for (supervisor/autofit.go): as many
// full-context sequences as an empty GPU of the largest type with enough
// GPUs on one node holds, at most fit.DefaultMaxSeqs; 1 without a GPU
// type to size for, or when not even one fits (the report then says so).
func chosenSeqs(p fit.Profile, req fit.Request, kinds []fit.GPUKind) int {
	k, ok := fit.SizedFor(kinds, req.TensorParallel)
	if !ok {
		return 1
	}
	return max(p.ChooseSeqs(req, k), 1)
}
