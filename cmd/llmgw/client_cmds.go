package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

func nodesCommand() *cli.Command {
	return &cli.Command{
		Name:  "nodes",
		Usage: "list the cluster's nodes as any node sees them",
		Flags: jsonClientFlags(),
		Action: func(ctx context.Context, c *cli.Command) error {
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			info, err := cl.cluster(ctx)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.Root().Writer, info.Members)
			}
			for _, m := range info.Members {
				if m.Isolated {
					fmt.Fprintf(c.Root().Writer, "%s is ISOLATED: it has heard no peer for %s, so this list is its last view; its shards' leases lapse elsewhere within the lease TTL\n",
						m.Name, shortDuration(time.Since(m.IsolatedSince)))
				}
				if m.State == gossip.StateRefused {
					fmt.Fprintf(c.Root().Writer, "%s is REFUSED: its build speaks protocol versions %d-%d and the cluster runs at version %d, which never goes down; upgrade it\n",
						m.Name, m.Protocol.Min, m.Protocol.Max, info.ActiveVersion)
				}
			}
			tw := tabwriter.NewWriter(c.Root().Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tADDRESS\tVERSION\tGPUS\tGPU MEMORY\tCLOCK\tAGE\tWEIGHTS")
			for _, m := range info.Members {
				age := "-"
				if !m.StartedAt.IsZero() {
					age = shortDuration(time.Since(m.StartedAt))
				}
				state := string(m.State)
				if m.TokenMismatch {
					state += " (other token)"
				}
				if m.Isolated {
					state += ", isolated"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Name, state, m.API, versionCell(m), gpuSummary(m.GPUs), gpuMemory(m.GPUs), clockOffset(m.ClockOffset), age, cachedSummary(m.CachedModels))
			}
			return tw.Flush()
		},
	}
}

// cluster is the answering node's view of the cluster (GET /v1/cluster).
func (cl *client) cluster(ctx context.Context) (status.ClusterInfo, error) {
	var info status.ClusterInfo
	err := cl.do(ctx, "GET", "/v1/cluster", nil, "", &info)
	return info, err
}

// versionCell writes a node's build and the protocol versions it speaks,
// "v0.3.0 p1-2": "-" for what its record or meta did not say.
func versionCell(m status.MemberInfo) string {
	v := m.AgentVersion
	if v == "" {
		v = "-"
	}
	if m.Protocol.Max > 0 {
		v += fmt.Sprintf(" p%d-%d", m.Protocol.Min, m.Protocol.Max)
	}
	return v
}

// clockOffset writes a node's clock minus the cluster's as "+0.1s", with
// a "!" past gossip.MaxClockOffset, where the node refuses writes; "-"
// when the answering node has no estimate.
func clockOffset(d *time.Duration) string {
	if d == nil {
		return "-"
	}
	s := fmt.Sprintf("%+.1fs", d.Seconds())
	if *d > gossip.MaxClockOffset || *d < -gossip.MaxClockOffset {
		s += "!"
	}
	return s
}

// gpuSummary writes "8× H100 80GB HBM3" (or several groups, comma-separated).
func gpuSummary(gpus []placement.GPU) string {
	if len(gpus) == 0 {
		return "-"
	}
	count := map[string]int{}
	var names []string
	for _, g := range gpus {
		n := strings.TrimPrefix(g.Name, "NVIDIA ")
		if count[n] == 0 {
			names = append(names, n)
		}
		count[n]++
	}
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%d× %s", count[n], n))
	}
	return strings.Join(parts, ", ")
}

func gpuMemory(gpus []placement.GPU) string {
	if len(gpus) == 0 {
		return "-"
	}
	var used, total uint64
	for _, g := range gpus {
		used += g.MemoryUsed
		total += g.MemoryTotal
	}
	return fmt.Sprintf("%.1f/%.0f GiB", float64(used)/(1<<30), float64(total)/(1<<30))
}

func shortDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

func placeCommand() *cli.Command {
	flags := append(jsonClientFlags(),
		&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Usage: "read the deployment from a YAML or JSON file ('-' for stdin)"},
		&cli.StringFlag{Name: "model", Usage: "model id or path, e.g. meta-llama/Llama-3.1-8B-Instruct"},
		&cli.StringFlag{Name: "engine", Usage: "engine profile: " + strings.Join(placement.EngineProfiles(), ", ") + " (default vllm)"},
		&cli.IntFlag{Name: "replicas", Value: 1, Usage: "serving endpoints"},
		&cli.StringFlag{Name: "tp", Value: "1", Usage: "tensor parallel: GPUs of one node per shard, or auto (with --gpu-memory auto: the smallest that fits)"},
		&cli.IntFlag{Name: "pp", Value: 1, Usage: "pipeline parallel: nodes per replica"},
		&cli.StringFlag{Name: "gpu-memory", Usage: "memory per GPU, e.g. 70GiB, or auto: computed from the model's files (default: whole GPUs)"},
		&cli.IntFlag{Name: "max-model-len", Usage: "the context each sequence gets, passed to the engine and checked against --gpu-memory (default: the model's own)"},
		&cli.IntFlag{Name: "max-num-seqs", Usage: "concurrent sequences, passed to the engine and checked against --gpu-memory (default: with --gpu-memory auto as many full-context ones as the GPU holds, up to 16; else the engine's own limit)"},
		&cli.StringFlag{Name: "gpu-type", Usage: "substring of the GPU name, e.g. H100"},
		&cli.StringSliceFlag{Name: "label", Usage: "node label k=v the shards need (repeatable)"},
		&cli.StringFlag{Name: "image", Usage: "container image (default: the engine profile's)"},
		&cli.StringSliceFlag{Name: "arg", Usage: "extra engine argument (repeatable)"},
		&cli.StringSliceFlag{Name: "env", Usage: "engine environment K=V (repeatable)"},
		waitFlag(),
		&cli.StringFlag{Name: "update", Usage: "how a new version replaces the old: surge (default: beside it, the old serving until the new is ready) or recreate (the old stops first: a planned gap, for replicas too large to surge)"},
		&cli.DurationFlag{Name: "start-timeout", Usage: "how long an engine may start (after its image pull) without becoming ready and without progress (its log or the weights cache growing); default 2h; changing it restarts nothing"},
		&cli.IntFlag{Name: "min-replicas", HideDefault: true, Usage: "autoscale: the fewest replicas (with --max-replicas; instead of --replicas); the cluster chooses within them by load"},
		&cli.IntFlag{Name: "max-replicas", HideDefault: true, Usage: "autoscale: the most replicas (with --min-replicas)"},
		&cli.IntFlag{Name: "target-inflight", HideDefault: true, Usage: "autoscale: running plus waiting requests per replica to aim at (default: --max-num-seqs when set, else 8)"},
		&cli.DurationFlag{Name: "scale-down-delay", HideDefault: true, Usage: "autoscale: how long demand must stay low before a replica goes (default 5m)"},
		&cli.DurationFlag{Name: "idle-window", HideDefault: true, Usage: "autoscale with --min-replicas 0: how long without any request before the last replica goes (default 10m); a request at any gateway wakes it"},
		&cli.IntFlag{Name: "max-loras", HideDefault: true, Usage: "LoRA: how many adapters one batch may hold (vLLM --max-loras, SGLang --max-loras-per-batch); turns LoRA on; a start flag, so changing it restarts the engines"},
		&cli.IntFlag{Name: "max-lora-rank", HideDefault: true, Usage: "LoRA: the largest adapter rank (1, 8, 16, 32, 64, 128, 256, 320 or 512; default 16); changing it restarts the engines"},
		&cli.StringSliceFlag{Name: "adapter", Usage: "LoRA adapter NAME=SOURCE (repeatable): SOURCE is a directory in the weights dir, an absolute path the engine reads, or a hub id; registered on every replica at runtime (llama.cpp: at start)"},
		&cli.IntFlag{Name: "prefill-replicas", HideDefault: true, Usage: "prefill/decode disaggregation: prefill replicas (with --decode-replicas; instead of --replicas); engines vllm, sglang and fake"},
		&cli.IntFlag{Name: "decode-replicas", HideDefault: true, Usage: "prefill/decode disaggregation: decode replicas (with --prefill-replicas)"},
		&cli.IntFlag{Name: "prefill-tp", HideDefault: true, Usage: "a prefill replica's tensor parallel size (default --tp)"},
		&cli.IntFlag{Name: "decode-tp", HideDefault: true, Usage: "a decode replica's tensor parallel size (default --tp)"},
		&cli.StringFlag{Name: "transfer-backend", Usage: "the KV transfer library: nixl (vllm, fake), mooncake or nixl (sglang); default the engine's"},
		&cli.StringFlag{Name: "transfer-nic", Usage: "the RDMA device the KV transfer uses, e.g. mlx5_0 (default: the library's choice)"},
		&cli.StringFlag{Name: "transfer-domain", Usage: "a node label key (e.g. rack): a role's replicas prefer nodes whose value of it matches the other role's nodes"},
		&cli.BoolFlag{Name: "pd-fallback", Usage: "let a decode replica serve a request alone when no prefill replica can (counted as fallback); default: such a request fails with an error saying why"},
		&cli.IntFlag{Name: "pd-skip-below", HideDefault: true, Usage: "skip the prefill leg for prompts whose uncached part is below this many tokens, as the gateway estimates it (counted as skipped); default 0: always disaggregate"},
		&cli.IntFlag{Name: "priority", HideDefault: true, Usage: "GPU sharing: when a deployment with demand does not fit, idle autoscaled replicas above their min give their GPUs up, lowest priority first (-1000 to 1000, default 0); changing it restarts nothing"},
	)
	return &cli.Command{
		Name:      "place",
		Usage:     "ask the cluster to serve a model (any node accepts it; every node learns it)",
		ArgsUsage: "NAME",
		Flags:     flags,
		Action:    placeAction,
	}
}

func placeBody(c *cli.Command) ([]byte, string, error) {
	if f := c.String("file"); f != "" {
		if c.Args().Len() > 0 {
			return nil, "", fmt.Errorf("--file: give either a file or NAME and flags, not both")
		}
		// The file is the whole spec: a flag beside it would be ignored
		// silently, so it is refused.
		for _, name := range []string{"model", "engine", "replicas", "tp", "pp", "gpu-memory", "max-model-len", "max-num-seqs", "gpu-type", "label", "image", "arg", "env", "update", "start-timeout",
			"min-replicas", "max-replicas", "target-inflight", "scale-down-delay", "idle-window", "priority", "max-loras", "max-lora-rank", "adapter",
			"prefill-replicas", "decode-replicas", "prefill-tp", "decode-tp", "transfer-backend", "transfer-nic", "transfer-domain", "pd-fallback", "pd-skip-below"} {
			if c.IsSet(name) {
				return nil, "", fmt.Errorf("--%s: not with --file; put it in the file", name)
			}
		}
		var b []byte
		var err error
		if f == "-" {
			b, err = io.ReadAll(os.Stdin)
		} else {
			b, err = os.ReadFile(f)
		}
		if err != nil {
			return nil, "", fmt.Errorf("--file: %w", err)
		}
		return b, "application/yaml", nil
	}
	if c.Args().Len() != 1 {
		return nil, "", fmt.Errorf("NAME: want exactly one deployment name (or --file)")
	}
	d := placement.Deployment{
		Name: c.Args().First(), Model: c.String("model"), Engine: c.String("engine"), Image: c.String("image"),
		Replicas: int(c.Int("replicas")), PipelineParallel: int(c.Int("pp")),
		GPUType: c.String("gpu-type"), Args: c.StringSlice("arg"), Update: c.String("update"),
		MaxModelLen: int(c.Int("max-model-len")), MaxNumSeqs: int(c.Int("max-num-seqs")),
		StartTimeout: placement.Duration(c.Duration("start-timeout")),
		Priority:     int(c.Int("priority")),
		MaxLoras:     int(c.Int("max-loras")), MaxLoraRank: int(c.Int("max-lora-rank")),
	}
	for _, a := range c.StringSlice("adapter") {
		name, src, ok := strings.Cut(a, "=")
		if !ok || name == "" || src == "" {
			return nil, "", fmt.Errorf("--adapter %q: want NAME=SOURCE, such as sql=org/sql-lora", a)
		}
		d.Adapters = append(d.Adapters, placement.Adapter{Name: name, Source: src})
	}
	for _, f := range []string{"max-loras", "max-lora-rank"} {
		if c.IsSet(f) && c.Int(f) < 1 {
			return nil, "", fmt.Errorf("--%s %d: want 1 or more (or leave it out)", f, c.Int(f))
		}
	}
	// Zero is how a spec says "unset" (omitempty), so an explicit 0 would
	// be sent as nothing: refused here, as the node refuses it.
	if c.IsSet("start-timeout") && (d.StartTimeout <= 0 || time.Duration(d.StartTimeout) > placement.MaxStartTimeout) {
		return nil, "", fmt.Errorf("--start-timeout %s: want a duration above 0 and at most 168h (7 days), such as 2h", c.Duration("start-timeout"))
	}
	d.TensorParallelAuto = c.String("tp") == "auto"
	if !d.TensorParallelAuto {
		tp, err := strconv.Atoi(c.String("tp"))
		if err != nil {
			return nil, "", fmt.Errorf("--tp %q: want an integer from 1 to 64 or auto", c.String("tp"))
		}
		d.TensorParallel = tp
	}
	if d.Model == "" {
		return nil, "", fmt.Errorf("--model: required, e.g. --model meta-llama/Llama-3.1-8B-Instruct")
	}
	// The spec leaves a zero out (omitempty), and the node would take the
	// missing field for 1: a 0 must be refused here or it runs as 1.
	if d.TensorParallel < 1 && !d.TensorParallelAuto {
		return nil, "", fmt.Errorf("--tp %d: want an integer from 1 to 64 (GPUs of one node per shard)", d.TensorParallel)
	}
	if d.PipelineParallel < 1 {
		return nil, "", fmt.Errorf("--pp %d: want an integer from 1 to 64 (nodes per replica)", d.PipelineParallel)
	}
	// As with --tp: a 0 would be sent as nothing and read as unset.
	for _, f := range []string{"max-model-len", "max-num-seqs"} {
		if c.IsSet(f) && c.Int(f) < 1 {
			return nil, "", fmt.Errorf("--%s %d: want 1 or more (or leave it out)", f, c.Int(f))
		}
	}
	if err := autoscaleFlags(c, &d); err != nil {
		return nil, "", err
	}
	if err := roleFlags(c, &d); err != nil {
		return nil, "", err
	}
	d.GPUMemoryAuto = c.String("gpu-memory") == "auto"
	if d.TensorParallelAuto && !d.GPUMemoryAuto {
		return nil, "", fmt.Errorf("--tp auto chooses the split from the model's size: add --gpu-memory auto")
	}
	if m := c.String("gpu-memory"); m != "" && !d.GPUMemoryAuto {
		b, err := placement.ParseBytes(m)
		if err != nil {
			return nil, "", fmt.Errorf("--gpu-memory: %w", err)
		}
		d.GPUMemory = b
	}
	var err error
	if d.Labels, err = parseKV("--label", splitList(c.StringSlice("label"))); err != nil {
		return nil, "", err
	}
	if d.Env, err = parseKV("--env", c.StringSlice("env")); err != nil {
		return nil, "", err
	}
	return autoBody(d)
}

// roleFlags puts --prefill-replicas, --decode-replicas, their TP and the
// transfer's settings in d; the node checks the values and names the
// fields, this what only the flags can get wrong.
func roleFlags(c *cli.Command, d *placement.Deployment) error {
	roles := c.IsSet("prefill-replicas") || c.IsSet("decode-replicas")
	if !roles {
		for _, f := range []string{"prefill-tp", "decode-tp", "transfer-backend", "transfer-nic", "transfer-domain", "pd-fallback", "pd-skip-below"} {
			if c.IsSet(f) {
				return fmt.Errorf("--%s: only with --prefill-replicas and --decode-replicas", f)
			}
		}
		return nil
	}
	if c.IsSet("replicas") {
		return fmt.Errorf("--replicas: not with --prefill-replicas and --decode-replicas, which say each role's count")
	}
	if c.IsSet("prefill-replicas") {
		d.Prefill = &placement.Role{Replicas: int(c.Int("prefill-replicas")), TensorParallel: int(c.Int("prefill-tp"))}
	}
	if c.IsSet("decode-replicas") {
		d.Decode = &placement.Role{Replicas: int(c.Int("decode-replicas")), TensorParallel: int(c.Int("decode-tp"))}
	}
	for _, f := range []string{"prefill-tp", "decode-tp"} {
		if c.IsSet(f) && c.Int(f) < 1 {
			return fmt.Errorf("--%s %d: want 1 to 64 (or leave it out: --tp)", f, c.Int(f))
		}
	}
	d.Replicas = 0
	if d.Prefill != nil && d.Decode != nil {
		d.Replicas = d.Prefill.Replicas + d.Decode.Replicas
	}
	t := placement.Transfer{Backend: c.String("transfer-backend"), NIC: c.String("transfer-nic"), Domain: c.String("transfer-domain"),
		Fallback: c.Bool("pd-fallback"), SkipBelow: int(c.Int("pd-skip-below"))}
	if t != (placement.Transfer{}) {
		d.Transfer = &t
	}
	return nil
}

// autoscaleFlags puts --min-replicas, --max-replicas, --target-inflight
// and --scale-down-delay in d; the node checks the values (and names the
// fields), this checks what only the flags can get wrong.
func autoscaleFlags(c *cli.Command, d *placement.Deployment) error {
	minSet, maxSet := c.IsSet("min-replicas"), c.IsSet("max-replicas")
	if !minSet && !maxSet {
		for _, f := range []string{"target-inflight", "scale-down-delay", "idle-window"} {
			if c.IsSet(f) {
				return fmt.Errorf("--%s: only with --min-replicas and --max-replicas (a fixed --replicas does not scale)", f)
			}
		}
		return nil
	}
	switch {
	case c.IsSet("replicas"):
		return fmt.Errorf("--replicas: not with --min-replicas/--max-replicas; give a fixed count or a range, not both")
	case !minSet || !maxSet:
		return fmt.Errorf("--min-replicas and --max-replicas: give both (the range the cluster chooses within)")
	case c.IsSet("target-inflight") && c.Int("target-inflight") < 1:
		return fmt.Errorf("--target-inflight %d: want 1 or more requests per replica (or leave it out)", c.Int("target-inflight"))
	case c.IsSet("scale-down-delay") && c.Duration("scale-down-delay") <= 0:
		return fmt.Errorf("--scale-down-delay %s: want a duration above 0, such as 5m (or leave it out)", c.Duration("scale-down-delay"))
	case c.IsSet("idle-window") && c.Duration("idle-window") <= 0:
		return fmt.Errorf("--idle-window %s: want a duration above 0, such as 10m (or leave it out)", c.Duration("idle-window"))
	}
	d.Autoscale = &placement.Autoscale{Min: int(c.Int("min-replicas")), Max: int(c.Int("max-replicas")),
		TargetInflight: int(c.Int("target-inflight")), ScaleDownDelay: placement.Duration(c.Duration("scale-down-delay")),
		IdleWindow: placement.Duration(c.Duration("idle-window"))}
	// As the node's decoder does: a deployment that may scale to zero
	// starts at one replica, and falls to zero once idle.
	d.Replicas = min(max(d.Autoscale.Min, 1), max(d.Autoscale.Max, 1))
	return nil
}

// autoBody writes d as the API reads it: "auto" where d says so, which
// the struct's own encoding leaves out (the marks never travel in a
// stored spec).
func autoBody(d placement.Deployment) ([]byte, string, error) {
	b, err := json.Marshal(d)
	if err != nil || (!d.GPUMemoryAuto && !d.TensorParallelAuto) {
		return b, "application/json", err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, "", err
	}
	if d.GPUMemoryAuto {
		m["gpu_memory"] = "auto"
	}
	if d.TensorParallelAuto {
		m["tensor_parallel"] = "auto"
	}
	b, err = json.Marshal(m)
	return b, "application/json", err
}

func unplaceCommand() *cli.Command {
	return &cli.Command{
		Name:      "unplace",
		Usage:     "remove a deployment everywhere",
		ArgsUsage: "NAME",
		Flags:     jsonClientFlags(),
		Action: func(ctx context.Context, c *cli.Command) error {
			if c.Args().Len() != 1 {
				return usageError("NAME: want exactly one deployment name")
			}
			name := c.Args().First()
			if err := placement.ValidateName(name); err != nil {
				return usageError("NAME: " + err.Error())
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			var out map[string]any
			if err := cl.do(ctx, "DELETE", "/v1/deployments/"+url.PathEscape(name), nil, "", &out); err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.Root().Writer, out)
			}
			fmt.Fprintf(c.Root().Writer, "removed %s\n", name)
			return nil
		},
	}
}

func modelsCommand() *cli.Command {
	return &cli.Command{
		Name:  "models",
		Usage: "list deployments: how many replicas are placed and ready, where, and why not; and the gateways clients send requests to",
		Flags: jsonClientFlags(),
		Action: func(ctx context.Context, c *cli.Command) error {
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			info, err := cl.cluster(ctx)
			if err != nil {
				return err
			}
			var deps []status.DeploymentInfo
			if err := cl.do(ctx, "GET", "/v1/deployments", nil, "", &deps); err != nil {
				return err
			}
			gws := status.Gateways(info.Members)
			if c.Bool("json") {
				if deps == nil {
					deps = []status.DeploymentInfo{}
				}
				return printJSON(c.Root().Writer, modelsJSON{Gateways: gws, Deployments: deps})
			}
			w := c.Root().Writer
			fmt.Fprintln(w, gatewayLine(gws))
			fmt.Fprintln(w)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tMODEL\tENGINE\tREPLICAS\tREADY\tNODES\tWHY")
			for _, d := range deps {
				why := "-"
				if len(d.Why) > 0 {
					why = d.Why[0]
					if len(d.Why) > 1 {
						why += fmt.Sprintf(" (+%d more)", len(d.Why)-1)
					}
				}
				nodes := strings.Join(d.Nodes, ",")
				if nodes == "" {
					nodes = "-"
				}
				replicas := fmt.Sprintf("%d/%d", d.Placed, d.Replicas)
				if a, sc := d.Autoscale, d.Scale; a != nil && sc != nil {
					// The target and the range it moves in; the rule's
					// word for it when nothing else is wrong.
					replicas += fmt.Sprintf(" (auto %d-%d)", a.Min, a.Max)
					if why == "-" && d.Replicas == 0 {
						why = "scaled to zero, wakes on request"
						if sc.LastColdStart > 0 {
							why += " (last cold start " + coldStartText(sc) + ")"
						}
					}
					if why == "-" && sc.Reason != "" {
						why = "autoscale: " + sc.Reason
						if sc.Decider != "" {
							why += " (decided by " + sc.Decider + ")"
						}
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", d.Name, d.Model, d.Engine, replicas, d.Ready, nodes, why)
				// A disaggregated deployment's roles under it, and every
				// way its requests lately were not disaggregated.
				for _, r := range d.Roles {
					fmt.Fprintf(tw, "  %s\t%s\t%s\t%d/%d\t%d\t%s\t%s\n", r.Role, "-", "role", r.Placed, r.Replicas, r.Ready, "-", "-")
				}
				for _, o := range slices.Sorted(maps.Keys(d.PDOutcomes)) {
					fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", o, "-", "pd outcome", "-", "-", "-", d.PDOutcomes[o])
				}
				// Its LoRA adapters under it: the source, the replicas
				// that list it (READY), and why others do not.
				for _, a := range d.AdapterStatus {
					on, why := strings.Join(a.Replicas, ","), "-"
					if on == "" {
						on = "-"
					}
					switch {
					case a.Shadowed != "":
						why = a.Shadowed
					case len(a.Errors) > 0:
						why = "not registered on " + a.Errors[0]
						if len(a.Errors) > 1 {
							why += fmt.Sprintf(" (+%d more)", len(a.Errors)-1)
						}
					}
					fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%s\t%s\n", a.Name, a.Source, "adapter", "-", len(a.Replicas), on, why)
				}
			}
			return tw.Flush()
		},
	}
}

// coldStartText is a deployment's last wake from zero and, where the
// ready replica's holder measured them, its parts: "6.6s: pull 0s, load
// and warm-up 2.1s, deciding, placing and gossip 4.5s".
func coldStartText(sc *status.ScaleInfo) string {
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }
	out := r(sc.LastColdStart).String()
	if sc.LastColdStartLoad > 0 {
		rest := max(sc.LastColdStart-sc.LastColdStartPull-sc.LastColdStartLoad, 0)
		out += fmt.Sprintf(": pull %s, load and warm-up %s, deciding, placing and gossip %s", r(sc.LastColdStartPull), r(sc.LastColdStartLoad), r(rest))
	}
	return out
}

// modelsJSON is `llmgw models --json`: the gateways clients can use (any
// of them routes to every deployment) and the deployments.
type modelsJSON struct {
	Gateways    []status.GatewayInfo    `json:"gateways"`
	Deployments []status.DeploymentInfo `json:"deployments"`
}

// maxGatewaysShown bounds the GATEWAYS line; --json lists them all.
const maxGatewaysShown = 8

// gatewayLine says where clients send requests: the alive nodes'
// gateways, any of which routes to every deployment.
func gatewayLine(gws []status.GatewayInfo) string {
	if len(gws) == 0 {
		return "GATEWAYS  none: no alive node runs a gateway (see node up --gateway)"
	}
	var parts []string
	for i, g := range gws {
		if i == maxGatewaysShown {
			parts = append(parts, fmt.Sprintf("+%d more (--json lists them)", len(gws)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", g.URL, g.Node))
	}
	return "GATEWAYS  " + strings.Join(parts, ", ") + "; OpenAI clients use <gateway>/v1"
}

func shardsCommand() *cli.Command {
	return &cli.Command{
		Name:  "shards",
		Usage: "list every shard: where it runs, its lease, engine status and restarts",
		Flags: jsonClientFlags(),
		Action: func(ctx context.Context, c *cli.Command) error {
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			var shards []status.ShardInfo
			if err := cl.do(ctx, "GET", "/v1/shards", nil, "", &shards); err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.Root().Writer, shards)
			}
			sort.SliceStable(shards, func(i, j int) bool { return shards[i].ShardID < shards[j].ShardID })
			tw := tabwriter.NewWriter(c.Root().Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SHARD\tROLE\tRANK\tSPEC\tNODE\tGPUS\tLEASE\tSTATUS\tPID/CONTAINER\tURL\tRESTARTS\tUPTIME\tNOTE")
			for _, s := range shards {
				who := "-"
				if s.Container != "" {
					who = s.Container
				} else if s.PID > 0 {
					who = fmt.Sprint(s.PID)
				}
				up := "-"
				if !s.StartedAt.IsZero() && s.Status == gossip.ShardReady {
					up = shortDuration(time.Since(s.StartedAt))
				}
				note := s.Reason
				if s.Draining {
					note = "draining (old spec or scaled away; kept until the current replicas are ready)"
				}
				if s.LastExit != nil {
					note = strings.TrimSpace(fmt.Sprintf("last exit %d %s", *s.LastExit, note))
				}
				note = strings.TrimSpace(note + " " + gangNote(s) + " " + engineNote(s, time.Now()))
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", s.ShardID, dash(s.Role), gangRank(s), dash(s.SpecVersion), dash(s.Node), ints(s.GPUs), s.Lease, s.Status, who, dash(s.URL), s.Restarts, up, dash(note))
			}
			return tw.Flush()
		},
	}
}

// engineNote is what the holder says its engine is doing while it does
// not serve: "pulling image 43%", "loading, log grew 2s ago", "not
// routable: ...". A note about a moment says how long ago, by this
// machine's clock (the record carries the moment, not the words, so it
// need not change every second).
func engineNote(s status.ShardInfo, now time.Time) string {
	if s.Note == "" || s.Lease == placement.LeaseValid {
		return ""
	}
	if s.Note == "loading" && !s.NoteAt.IsZero() {
		// The moment is the start itself until the log or the weights
		// grow for the first time.
		if d := s.NoteAt.Sub(s.StartedAt); d > -time.Second && d < time.Second {
			return fmt.Sprintf("loading for %s, no log output yet", shortDuration(now.Sub(s.NoteAt)))
		}
		return fmt.Sprintf("loading, log grew %s ago", shortDuration(now.Sub(s.NoteAt)))
	}
	return s.Note
}

// gangRank is a gang member's rank of its gang's size ("1/2"); "-" for
// a replica of one shard.
func gangRank(s status.ShardInfo) string {
	if s.Gang == nil {
		return "-"
	}
	return fmt.Sprintf("%d/%d", s.Gang.Rank, s.Gang.Size)
}

// gangNote is what holds a gang member back, while it does not serve:
// "rank 1 on n3: waiting for rank 0's address".
func gangNote(s status.ShardInfo) string {
	if s.Gang == nil || s.Gang.Note == "" || s.Lease == placement.LeaseValid {
		return ""
	}
	return fmt.Sprintf("rank %d on %s: %s", s.Gang.Rank, dash(s.Node), s.Gang.Note)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ints(v []int) string {
	if len(v) == 0 {
		return "-"
	}
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

// adapterCommand changes one LoRA adapter of a deployment without placing
// its whole spec again (Node.ChangeAdapter: a change made at once through
// another node is not lost).
func adapterCommand() *cli.Command {
	change := func(add bool) cli.ActionFunc {
		return func(ctx context.Context, c *cli.Command) error {
			want := 2
			if add {
				want = 3
			}
			if c.Args().Len() != want {
				if add {
					return usageError("DEPLOYMENT ADAPTER SOURCE: want a deployment, the adapter's name and its source (a directory in the weights dir, an absolute path, or a hub id)")
				}
				return usageError("DEPLOYMENT ADAPTER: want a deployment and the adapter's name")
			}
			dep, name := c.Args().Get(0), c.Args().Get(1)
			if err := placement.ValidateName(dep); err != nil {
				return usageError("DEPLOYMENT: " + err.Error())
			}
			if !placement.ValidAdapterName(name) {
				return usageError(fmt.Sprintf("ADAPTER %q: 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", name))
			}
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			var info status.DeploymentInfo
			path := "/v1/deployments/" + url.PathEscape(dep) + "/adapters"
			if add {
				body, _ := json.Marshal(placement.Adapter{Name: name, Source: c.Args().Get(2)})
				err = cl.do(ctx, "POST", path, body, "application/json", &info)
			} else {
				err = cl.do(ctx, "DELETE", path+"/"+url.PathEscape(name), nil, "", &info)
			}
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c.Root().Writer, info)
			}
			verb := "removed adapter %s from %s"
			if add {
				verb = "adapter %s of %s placed"
			}
			fmt.Fprintf(c.Root().Writer, verb+" (%d adapters): %s\n", name, dep, len(info.Adapters), changeWords(info.Change))
			return nil
		}
	}
	return &cli.Command{
		Name:  "adapter",
		Usage: "add or remove one LoRA adapter of a deployment (place --adapter sets the whole list)",
		Commands: []*cli.Command{
			{Name: "add", Usage: "add an adapter, or give one a new source", ArgsUsage: "DEPLOYMENT ADAPTER SOURCE", Flags: jsonClientFlags(), Action: change(true)},
			{Name: "remove", Usage: "remove an adapter", ArgsUsage: "DEPLOYMENT ADAPTER", Flags: jsonClientFlags(), Action: change(false)},
		},
	}
}
