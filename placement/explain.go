package placement

import (
	"fmt"
	"strings"
)

// Rejections are data: a shard that cannot be placed carries the reason,
// built from how many nodes each filter let through, in filter order, so it
// names the filter that actually stopped it.

// funnel counts the nodes that pass each filter for one deployment, in the
// current state of the cluster.
type funnel struct {
	nodes   int // in the view
	alive   int // ... alive
	labeled int // ... matching the deployment's labels
	typed   int // ... with at least one GPU of the asked type
	usable  int // ... with tensor_parallel such GPUs neither MIG nor faulted
	fits    int // ... with tensor_parallel such GPUs free enough

	mig, faulted int // type-matching GPUs on labelled live nodes

	bestUsable  *nodeState
	bestUsableN int
	bestElig    *nodeState
	bestEligN   int
	// freest is the node whose tp most-free GPUs have the most free
	// (memory-sized shards), and freestBytes what each of them has.
	freest      *nodeState
	freestBytes uint64
}

func (p *planner) funnelFor(d *depState) *funnel {
	if d.funnelAt == p.version+1 {
		return &d.funnel
	}
	f := funnel{}
	tp := d.d.TensorParallel
	for _, n := range p.nodes { // by name, so "best node" ties go to the first name
		f.nodes++
		if !n.alive {
			continue
		}
		f.alive++
		if !n.class.matches(d.labels) {
			continue
		}
		f.labeled++
		ft := p.fitFor(n.class, d.shapeID)
		if ft.typed == 0 {
			continue
		}
		f.typed++
		f.mig += ft.mig
		f.faulted += ft.faulted
		if f.bestUsable == nil || ft.usable > f.bestUsableN {
			f.bestUsable, f.bestUsableN = n, ft.usable
		}
		if ft.usable < tp {
			continue
		}
		f.usable++
		if f.bestElig == nil || ft.eligible > f.bestEligN {
			f.bestElig, f.bestEligN = n, ft.eligible
		}
		if ft.freeAtTP > f.freestBytes {
			f.freest, f.freestBytes = n, ft.freeAtTP
		}
		if ft.ok {
			f.fits++
		}
	}
	d.funnel, d.funnelAt = f, p.version+1
	return &d.funnel
}

// explain says why gang g of d could not be placed; picked shards of it had
// found a node before one did not.
func (p *planner) explain(d *depState, g gang, picked int) string {
	f := p.funnelFor(d)
	dd := d.d
	var why string
	switch {
	case f.nodes == 0:
		why = "no nodes in the cluster view"
	case f.alive == 0:
		why = fmt.Sprintf("no live node (%d in the view, none alive)", f.nodes)
	case f.labeled == 0:
		why = fmt.Sprintf("no live node matches labels %s (%s)", formatLabels(dd.Labels), checked(f.alive))
	case f.typed == 0 && dd.GPUType == "":
		why = fmt.Sprintf("no live node%s has any GPU (%s)", labelClause(dd.Labels), checked(f.labeled))
	case f.typed == 0:
		why = fmt.Sprintf("no live node%s has a GPU matching %q (%s; GPUs seen: %s)",
			labelClause(dd.Labels), dd.GPUType, checked(f.labeled), p.gpuNamesSeen(d))
	case f.usable == 0:
		why = fmt.Sprintf("needs %d %sGPU%s on one node that are neither MIG-enabled nor faulted; best node %s has %d (%s)%s",
			dd.TensorParallel, typeWord(dd.GPUType), plural(dd.TensorParallel), f.bestUsable.name, f.bestUsableN, checked(f.typed), unusableNote(f))
	case f.fits == 0:
		why = fmt.Sprintf("needs %s; best node %s has %d (%s)%s%s%s",
			describeRequest(dd), f.bestElig.name, f.bestEligN, checked(f.usable), freestNote(dd, f), wholeNote(dd), unusableNote(f))
	default:
		// Single shards fit somewhere, so what is missing is distinct nodes
		// for the gang (or nodes that are not its kept shards' nodes).
		why = fmt.Sprintf("gang of %d shards needs %d distinct nodes with %s each; only %d fit",
			len(g.rep.shards), len(g.missing), describeRequest(dd), picked)
		if kept := keptNodes(g.rep); kept != "" {
			why += " besides " + kept + ", where its other shards stay"
		}
	}
	return why
}

// freestNote quotes the most free memory a memory-sized shard could get.
func freestNote(d Deployment, f *funnel) string {
	if d.GPUMemory == 0 || f.freest == nil {
		return ""
	}
	return fmt.Sprintf("; largest free: %d × %s on %s", d.TensorParallel, gibs(f.freestBytes), f.freest.name)
}

// gibs is a size in GiB with one decimal, as gpu_memory: auto reasons
// quote figures that are rarely whole.
func gibs(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

func describeRequest(d Deployment) string {
	var s string
	switch {
	case d.GPUMemory == 0:
		s = fmt.Sprintf("%d whole GPU%s", d.TensorParallel, plural(d.TensorParallel))
	case d.Fit != nil:
		s = fmt.Sprintf("%d × %s at TP %d", d.TensorParallel, gibs(uint64(d.GPUMemory)), d.TensorParallel)
	default:
		s = fmt.Sprintf("%d GPU%s with %s free", d.TensorParallel, plural(d.TensorParallel), d.GPUMemory)
	}
	if d.GPUType != "" {
		s += " (" + d.GPUType + ")"
	}
	if d.Fit != nil {
		s += fmt.Sprintf(" with %d × %d tokens of context (gpu_memory auto: %s)", max(d.MaxNumSeqs, 1), d.MaxModelLen, d.Fit)
	}
	return s
}

func wholeNote(d Deployment) string {
	if d.GPUMemory != 0 {
		return ""
	}
	return fmt.Sprintf("; a whole GPU must hold no shard of ours and at most %s of other processes' memory", Bytes(wholeGPUForeignSlack))
}

// verb picks the singular or plural form for a count.
func verb(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func unusableNote(f *funnel) string {
	var s string
	if f.mig > 0 {
		s += fmt.Sprintf("; %d MIG-enabled GPU%s %s nothing new", f.mig, plural(f.mig), verb(f.mig, "takes", "take"))
	}
	if f.faulted > 0 {
		s += fmt.Sprintf("; %d GPU%s with recent driver faults %s nothing new", f.faulted, plural(f.faulted), verb(f.faulted, "takes", "take"))
	}
	return s
}

func typeWord(t string) string {
	if t == "" {
		return ""
	}
	return t + " "
}

func labelClause(l map[string]string) string {
	if len(l) == 0 {
		return ""
	}
	return " matching labels " + formatLabels(l)
}

func formatLabels(l map[string]string) string {
	parts := make([]string, 0, len(l))
	for _, k := range sortedKeys(l) {
		parts = append(parts, k+"="+l[k])
	}
	return strings.Join(parts, ",")
}

func checked(n int) string { return fmt.Sprintf("%d node%s checked", n, plural(n)) }

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// gpuNamesSeen lists the distinct GPU models on live labelled nodes, for a
// type filter that matched none of them.
func (p *planner) gpuNamesSeen(d *depState) string {
	seen := map[string]bool{}
	for _, n := range p.nodes {
		if n.alive && n.class.matches(d.labels) {
			for _, g := range n.class.gpus {
				seen[g.name] = true
			}
		}
	}
	names := sortedKeys(seen)
	if len(names) == 0 {
		return "none"
	}
	const show = 4
	if len(names) > show {
		return strings.Join(names[:show], ", ") + fmt.Sprintf(" and %d more", len(names)-show)
	}
	return strings.Join(names, ", ")
}

func keptNodes(r *replicaState) string {
	var names []string
	for _, s := range r.shards {
		if s.kept.ok() {
			names = append(names, s.kept.node.name)
		}
	}
	return strings.Join(names, ", ")
}
