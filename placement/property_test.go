package placement

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// tb is what the checks need of *testing.T and *rapid.T alike.
type tb interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Fatal(args ...any)
}

// onFaultedGPUs reports whether any of gpus is faulted on n or missing.
func onFaultedGPUs(n Node, gpus []int) bool {
	for _, idx := range gpus {
		i := slices.IndexFunc(n.GPUs, func(g GPU) bool { return g.Index == idx })
		if i < 0 || n.GPUs[i].Faulted {
			return true
		}
	}
	return false
}

// checkInvariants asserts what must hold of any plan for its view.
func checkInvariants(t tb, v View, p Plan) {
	t.Helper()
	nodes := map[string]*Node{}
	for i := range v.Nodes {
		if _, dup := nodes[v.Nodes[i].Name]; !dup {
			nodes[v.Nodes[i].Name] = &v.Nodes[i]
		}
	}

	// Sorted output.
	if !slices.IsSortedFunc(p.Assignments, func(a, b Assignment) int {
		return strings.Compare(a.ShardID+"\x00"+a.SpecVersion, b.ShardID+"\x00"+b.SpecVersion)
	}) {
		t.Errorf("assignments not sorted")
	}
	if !slices.IsSortedFunc(p.Unplaced, func(a, b Unplaced) int { return strings.Compare(a.ShardID, b.ShardID) }) {
		t.Errorf("unplaced not sorted")
	}
	for _, a := range p.Assignments {
		if !slices.IsSorted(a.GPUs) {
			t.Errorf("%s: GPUs not sorted: %v", a.ShardID, a.GPUs)
		}
	}
	for _, u := range p.Unplaced {
		if strings.TrimSpace(u.Reason) == "" {
			t.Errorf("%s: unplaced without a reason", u.ShardID)
		}
	}

	// Every shard of every valid deployment: one current assignment or one
	// unplaced entry, never both.
	byDep := map[string]Deployment{}
	for _, d := range v.Deployments {
		d = d.WithDefaults()
		if d.Validate() == nil {
			byDep[d.Name] = d
		}
	}
	current := map[string][]Assignment{} // by replica
	for _, d := range byDep {
		ver := d.SpecVersion()
		for i := range d.Replicas {
			r := ReplicaID(d.Name, i)
			for j := range d.PipelineParallel {
				id := ShardID(r, j, d.PipelineParallel)
				n := 0
				for _, a := range find(p, id) {
					if a.SpecVersion != ver {
						continue
					}
					// A current-version copy drains only on a GPU with
					// recent faults, serving until its replacement is
					// ready; it is not the shard's assignment.
					if a.Draining {
						if n := nodes[a.Node]; n == nil || !onFaultedGPUs(*n, a.GPUs) {
							t.Errorf("%s: current version marked draining on %s, GPUs %v without faults", id, a.Node, a.GPUs)
						}
						continue
					}
					n++
					current[r] = append(current[r], a)
				}
				_, un := unplaced(p, id)
				if n > 1 || (n == 1) == un {
					t.Errorf("%s: %d current assignments, unplaced %v", id, n, un)
				}
			}
		}
	}

	// Gangs: new shards only when the whole replica is assigned, each on a
	// node of its own. (Kept shards may already share a node: duplicate
	// claims after a partition can put them there, and kept shards do not
	// move.)
	for r, as := range current {
		fresh := false
		for _, a := range as {
			fresh = fresh || !a.Kept
		}
		if !fresh {
			continue
		}
		d := byDep[as[0].Deployment]
		if len(as) != d.PipelineParallel {
			t.Errorf("replica %s: %d of %d shards assigned with new ones among them", r, len(as), d.PipelineParallel)
		}
		for _, a := range as {
			for _, b := range as {
				if a.ShardID < b.ShardID && a.Node == b.Node && (!a.Kept || !b.Kept) {
					t.Errorf("replica %s: new shard beside another on %s: %+v", r, a.Node, as)
				}
			}
		}
	}

	// Kept means held, live, with the same GPUs.
	for _, a := range p.Assignments {
		n := nodes[a.Node]
		if n == nil {
			t.Errorf("%s: on unknown node %s", a.ShardID, a.Node)
			continue
		}
		if !a.Kept {
			if !n.Alive {
				t.Errorf("%s: new on dead node %s", a.ShardID, a.Node)
			}
			d := byDep[a.Deployment]
			for k, want := range d.Labels {
				if n.Labels[k] != want {
					t.Errorf("%s: on %s without label %s=%s", a.ShardID, a.Node, k, want)
				}
			}
			if len(a.GPUs) != d.TensorParallel {
				t.Errorf("%s: %d GPUs, want %d", a.ShardID, len(a.GPUs), d.TensorParallel)
			}
			continue
		}
		ok := false
		for _, h := range n.Shards {
			if h.ShardID == a.ShardID && h.SpecVersion == a.SpecVersion && liveLease(h.Lease) &&
				slices.Equal(sortedInts(h.GPUs), a.GPUs) {
				ok = true
			}
		}
		if !ok || !n.Alive {
			t.Errorf("%s: kept on %s without a live claim there", a.ShardID, a.Node)
		}
	}

	checkCapacity(t, v, p)
}

// checkCapacity: a GPU that received a new shard is not over-committed,
// counting every shard its node lists (kept, draining or on its way out)
// plus the new ones, and a whole GPU is never shared.
func checkCapacity(t tb, v View, p Plan) {
	t.Helper()
	type use struct {
		mem   uint64
		whole int
		ours  int
		fresh bool
	}
	gpus := map[string]GPU{}
	uses := map[string]*use{}
	key := func(node string, idx int) string { return fmt.Sprintf("%s/%d", node, idx) }
	seen := map[string]bool{}
	for _, n := range v.Nodes {
		if seen[n.Name] || !n.Alive {
			continue
		}
		seen[n.Name] = true
		for _, g := range n.GPUs {
			if _, dup := gpus[key(n.Name, g.Index)]; !dup {
				gpus[key(n.Name, g.Index)] = g
				uses[key(n.Name, g.Index)] = &use{}
			}
		}
		for _, h := range n.Shards {
			for _, i := range sortedInts(h.GPUs) {
				if u := uses[key(n.Name, i)]; u != nil {
					u.ours++
					if h.MemoryPerGPU == 0 {
						u.whole++
					}
					u.mem += h.MemoryPerGPU
				}
			}
		}
	}
	for _, a := range p.Assignments {
		if a.Kept {
			continue
		}
		for _, i := range a.GPUs {
			u := uses[key(a.Node, i)]
			if u == nil {
				t.Errorf("%s: GPU %s/%d does not exist", a.ShardID, a.Node, i)
				continue
			}
			u.fresh = true
			u.ours++
			if a.MemoryPerGPU == 0 {
				u.whole++
			}
			u.mem += a.MemoryPerGPU
		}
	}
	for k, u := range uses {
		if !u.fresh {
			continue
		}
		g := gpus[k]
		if g.MIG || g.Faulted {
			t.Errorf("GPU %s: new shard on a MIG or faulted GPU", k)
		}
		if u.whole > 0 && (u.ours > 1 || g.MemoryForeign > wholeGPUForeignSlack) {
			t.Errorf("GPU %s: whole GPU shared (%d shards of ours, %d foreign bytes)", k, u.ours, g.MemoryForeign)
		}
		if u.whole == 0 && u.mem+g.MemoryForeign > g.MemoryTotal {
			t.Errorf("GPU %s: over-committed: %d promised + %d foreign > %d", k, u.mem, g.MemoryForeign, g.MemoryTotal)
		}
	}
}

// Generators. Sizes are small so that contention (full nodes, gangs that do
// not fit, duplicates) is common.

var gpuModels = []struct {
	name string
	mem  uint64
}{
	{"NVIDIA H100 80GB HBM3", 80 * gib},
	{"NVIDIA A100-SXM4-40GB", 40 * gib},
	{"NVIDIA L4", 24 * gib},
}

func genNode(t *rapid.T, name string) Node {
	model := gpuModels[rapid.IntRange(0, len(gpuModels)-1).Draw(t, "model")]
	count := rapid.IntRange(0, 8).Draw(t, "gpus")
	n := Node{Name: name, Alive: rapid.IntRange(0, 9).Draw(t, "alive") > 0}
	topo := rapid.IntRange(0, 2).Draw(t, "topology") // none, all-to-all, pairs
	for i := range count {
		g := GPU{Index: i, UUID: fmt.Sprintf("%s-%d", name, i), Name: model.name, MemoryTotal: model.mem}
		if rapid.IntRange(0, 4).Draw(t, "foreign?") == 0 {
			g.MemoryForeign = uint64(rapid.IntRange(0, 8).Draw(t, "foreignGiB")) * gib / 2
		}
		g.MIG = rapid.IntRange(0, 19).Draw(t, "mig") == 0
		g.Faulted = rapid.IntRange(0, 19).Draw(t, "faulted") == 0
		switch topo {
		case 1:
			for j := range count {
				if j != i {
					g.NVLinkPeers = append(g.NVLinkPeers, j)
				}
			}
		case 2:
			if i^1 < count {
				g.NVLinkPeers = []int{i ^ 1}
			}
		}
		n.GPUs = append(n.GPUs, g)
	}
	if rapid.Bool().Draw(t, "zoned") {
		n.Labels = map[string]string{"zone": rapid.SampledFrom([]string{"a", "b"}).Draw(t, "zone"), "rack": name}
	}
	if rapid.Bool().Draw(t, "cache") {
		n.CachedModels = []string{fmt.Sprintf("org/m%d", rapid.IntRange(0, 3).Draw(t, "cached"))}
	}
	return n
}

func genDeployment(t *rapid.T, name string) Deployment {
	d := Deployment{
		Name:             name,
		Model:            fmt.Sprintf("org/m%d", rapid.IntRange(0, 3).Draw(t, "model")),
		Replicas:         rapid.IntRange(0, 4).Draw(t, "replicas"),
		TensorParallel:   rapid.SampledFrom([]int{1, 1, 2, 4, 8}).Draw(t, "tp"),
		PipelineParallel: rapid.SampledFrom([]int{1, 1, 1, 2, 3}).Draw(t, "pp"),
	}
	if rapid.Bool().Draw(t, "sized") {
		d.GPUMemory = Bytes(rapid.SampledFrom([]uint64{4, 10, 20, 30, 39, 70}).Draw(t, "memGiB") * gib)
	}
	if rapid.IntRange(0, 3).Draw(t, "typed") == 0 {
		d.GPUType = rapid.SampledFrom([]string{"h100", "A100", "l4", "B200"}).Draw(t, "type")
	}
	if rapid.IntRange(0, 3).Draw(t, "labelled") == 0 {
		d.Labels = map[string]string{"zone": rapid.SampledFrom([]string{"a", "b", "c"}).Draw(t, "zone")}
	}
	if rapid.IntRange(0, 9).Draw(t, "invalid") == 0 {
		d.Engine = "nope"
	}
	return d
}

// genView draws a cluster, lets it converge one step, then disturbs it:
// leases change state, nodes die, specs change, claims are duplicated. The
// held shards therefore look like a real cluster's, not like noise.
func genView(t *rapid.T) View {
	nNodes := rapid.IntRange(0, 7).Draw(t, "nodes")
	nDeps := rapid.IntRange(0, 4).Draw(t, "deployments")
	var v View
	for i := range nNodes {
		v.Nodes = append(v.Nodes, genNode(t, fmt.Sprintf("n%d", i)))
	}
	for i := range nDeps {
		v.Deployments = append(v.Deployments, genDeployment(t, fmt.Sprintf("d%d", i)))
	}
	if !rapid.Bool().Draw(t, "converge") {
		return v
	}
	v = heldFromPlan(v, Compute(v), LeaseValid)
	leases := []LeaseState{LeaseValid, LeaseValid, LeaseStarting, LeaseLapsed}
	for i := range v.Nodes {
		n := &v.Nodes[i]
		if rapid.IntRange(0, 5).Draw(t, "dies") == 0 {
			n.Alive = false
		}
		for j := range n.Shards {
			n.Shards[j].Lease = rapid.SampledFrom(leases).Draw(t, "lease")
			n.Shards[j].Failing = rapid.IntRange(0, 9).Draw(t, "failing") == 0
			n.Shards[j].ClaimStamp = int64(rapid.IntRange(0, 3).Draw(t, "stamp"))
		}
	}
	// A duplicate claim, as after a partition: copy a shard to another
	// node, on GPUs that exist there.
	if len(v.Nodes) > 1 && rapid.Bool().Draw(t, "duplicate") {
		from := rapid.IntRange(0, len(v.Nodes)-1).Draw(t, "from")
		to := rapid.IntRange(0, len(v.Nodes)-1).Draw(t, "to")
		if src := v.Nodes[from].Shards; len(src) > 0 && from != to && len(v.Nodes[to].GPUs) > 0 {
			h := src[rapid.IntRange(0, len(src)-1).Draw(t, "which")]
			h.GPUs = []int{0}
			h.ClaimStamp = int64(rapid.IntRange(0, 3).Draw(t, "stamp"))
			v.Nodes[to].Shards = append(v.Nodes[to].Shards, h)
		}
	}
	for i := range v.Deployments {
		d := &v.Deployments[i]
		switch rapid.IntRange(0, 5).Draw(t, "change") {
		case 0:
			d.Args = []string{"--changed"} // new spec version: rolling change
		case 1:
			d.Replicas = rapid.IntRange(0, 5).Draw(t, "rescale")
		}
	}
	// GPU sharing: some deployments autoscale, some of those are idle.
	if rapid.Bool().Draw(t, "share") {
		v.Share, v.Usage = true, map[string]Usage{}
		for i := range v.Deployments {
			d := &v.Deployments[i]
			if rapid.Bool().Draw(t, "autoscaled") {
				d.Autoscale = &Autoscale{Min: rapid.IntRange(0, d.Replicas).Draw(t, "min"), Max: max(d.Replicas, 1)}
				d.Priority = rapid.IntRange(-2, 2).Draw(t, "priority")
				v.Usage[d.Name] = Usage{Idle: rapid.Bool().Draw(t, "idle"), LastRequest: int64(rapid.IntRange(0, 3).Draw(t, "last"))}
			}
		}
	}
	return v
}

func TestPropertyInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := genView(t)
		before := mustJSON(t, v)
		p := Compute(v)
		if mustJSON(t, v) != before {
			t.Fatalf("Compute modified its input")
		}
		checkInvariants(t, v, p)
	})
}

// Equal views in any order give byte-identical plans.
func TestPropertyPermutation(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := genView(t)
		want := mustJSON(t, Compute(v))
		w := View{
			Nodes:       rapid.Permutation(v.Nodes).Draw(t, "nodes"),
			Deployments: rapid.Permutation(v.Deployments).Draw(t, "deps"),
			Share:       v.Share, Usage: v.Usage,
		}
		for i := range w.Nodes {
			n := w.Nodes[i]
			n.GPUs = rapid.Permutation(n.GPUs).Draw(t, "gpus")
			for j := range n.GPUs {
				n.GPUs[j].NVLinkPeers = rapid.Permutation(n.GPUs[j].NVLinkPeers).Draw(t, "peers")
			}
			n.Shards = rapid.Permutation(n.Shards).Draw(t, "shards")
			n.CachedModels = rapid.Permutation(n.CachedModels).Draw(t, "cached")
			w.Nodes[i] = n
		}
		if got := mustJSON(t, Compute(w)); got != want {
			t.Fatalf("plan depends on order\nwant %s\ngot  %s", want, got)
		}
		if got := mustJSON(t, Compute(v)); got != want {
			t.Fatalf("Compute modified its input or is not repeatable")
		}
	})
}

// Adding a node or a deployment that has nothing to do with a held shard
// never moves it. (A shard that keeps failing, or sits on a GPU with recent
// faults, is kept only for want of a better place, so a new node may take
// it; so is every member of a gang with a failing member, which moves as a
// whole.)
func TestPropertyStability(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		v := genView(t)
		// Sharing moves held shards by design (to a new deployment with
		// demand): this property is of placement without it.
		v.Share, v.Usage = false, nil
		failing := map[string]bool{}
		failingGang := map[string]bool{}
		for _, n := range v.Nodes {
			for _, h := range n.Shards {
				if h.Failing || onFaultedGPUs(n, h.GPUs) {
					failing[n.Name+"/"+h.ShardID] = true
				}
				if i := strings.LastIndex(h.ShardID, "-s"); h.Failing && i > 0 {
					failingGang[h.ShardID[:i]] = true
				}
			}
		}
		before := Compute(v)
		w := View{Nodes: slices.Clone(v.Nodes), Deployments: slices.Clone(v.Deployments)}
		if rapid.Bool().Draw(t, "addNode") {
			w.Nodes = append(w.Nodes, genNode(t, "new-node"))
		} else {
			w.Deployments = append(w.Deployments, genDeployment(t, "new-dep"))
		}
		after := Compute(w)
		for _, a := range before.Assignments {
			if !a.Kept || failing[a.Node+"/"+a.ShardID] || failingGang[a.ReplicaID] {
				continue
			}
			found := false
			for _, b := range find(after, a.ShardID) {
				found = found || mustJSON(t, a) == mustJSON(t, b)
			}
			if !found {
				t.Fatalf("kept %s on %s moved: %+v\nview %s", a.ShardID, a.Node, find(after, a.ShardID), mustJSON(t, w))
			}
		}
		checkInvariants(t, w, after)
	})
}

// A deployment's replicas land on distinct nodes whenever enough nodes can
// each take one.
func TestPropertySpread(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nNodes := rapid.IntRange(1, 12).Draw(t, "nodes")
		tpN := rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "tp")
		var v View
		for i := range nNodes {
			// Different sizes and fill levels, but every node fits at
			// least one shard, several on most.
			free := rapid.IntRange(tpN, 8).Draw(t, "gpus")
			v.Nodes = append(v.Nodes, mkNode(fmt.Sprintf("n%02d", i), hgpus(free, "NVIDIA H100 80GB HBM3", 80, rapid.Bool().Draw(t, "nvlink"))))
		}
		d := mkDep("spread", tp(tpN), replicas(rapid.IntRange(1, nNodes).Draw(t, "replicas")))
		if rapid.Bool().Draw(t, "sized") {
			d.GPUMemory = Bytes(uint64(rapid.IntRange(1, 80).Draw(t, "memGiB")) * gib)
		}
		v.Deployments = []Deployment{d}
		p := Compute(v)
		nodes := map[string]bool{}
		for _, a := range p.Assignments {
			if nodes[a.Node] {
				t.Fatalf("two replicas on %s with %d nodes for %d replicas: %+v", a.Node, nNodes, d.Replicas, p)
			}
			nodes[a.Node] = true
		}
		if len(p.Unplaced) != 0 {
			t.Fatalf("unplaced: %+v", p.Unplaced)
		}
	})
}

// Duplicates resolve by claim stamp, then node name, whatever else differs.
func TestPropertyDuplicates(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d := mkDep("a")
		ver := version(d)
		n := rapid.IntRange(2, 6).Draw(t, "holders")
		var v View
		type claim struct {
			serving bool
			stamp   int64
			name    string
		}
		// A serving copy beats one still loading; then the earliest claim,
		// then the lower name.
		better := func(c, b claim) bool {
			if c.serving != b.serving {
				return c.serving
			}
			if c.stamp != b.stamp {
				return c.stamp < b.stamp
			}
			return c.name < b.name
		}
		var best *claim
		for range n {
			name := fmt.Sprintf("n%d", rapid.IntRange(0, 99).Draw(t, "name"))
			if slices.ContainsFunc(v.Nodes, func(x Node) bool { return x.Name == name }) {
				continue
			}
			stamp := int64(rapid.IntRange(0, 3).Draw(t, "stamp"))
			lease := rapid.SampledFrom([]LeaseState{LeaseValid, LeaseStarting}).Draw(t, "lease")
			v.Nodes = append(v.Nodes, mkNode(name, hgpus(1, "H100", 80, false), holding(hold("a-0", ver, lease, stamp, 0))))
			c := claim{lease == LeaseValid, stamp, name}
			if best == nil || better(c, *best) {
				best = &c
			}
		}
		v.Deployments = []Deployment{d}
		p := Compute(v)
		as := find(p, "a-0")
		if len(as) != 1 || as[0].Node != best.name || !as[0].Kept {
			t.Fatalf("want kept on %s only, got %+v", best.name, as)
		}
	})
}
