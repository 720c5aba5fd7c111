package placement

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestShardIndex(t *testing.T) {
	for _, c := range []struct {
		shard, replica string
		want           int
		ok             bool
	}{
		{"m-0", "m-0", 0, true},
		{"m-0-s0", "m-0", 0, true},
		{"m-0-s3", "m-0", 3, true},
		{"m-0-s03", "m-0", 0, false},
		{"m-0-s", "m-0", 0, false},
		{"m-0-sx", "m-0", 0, false},
		{"m-1-s1", "m-0", 0, false},
		{"m-0-s-1", "m-0", 0, false},
	} {
		got, ok := ShardIndex(c.shard, c.replica)
		if got != c.want || ok != c.ok {
			t.Errorf("ShardIndex(%q, %q) = %d, %v; want %d, %v", c.shard, c.replica, got, ok, c.want, c.ok)
		}
	}
}

// Every node computes the plan from its own copy of the view, in whatever
// order it happens to hold nodes, GPUs and deployments; each must name the
// same rank 0 (and the same member at every rank) for every gang.
func TestGangRank0IsTheSameOnEveryNode(t *testing.T) {
	deps := []Deployment{mkDep("big", pp(2), tp(2), replicas(2)), mkDep("wide", pp(3), tp(1))}
	nodes := []Node{
		mkNode("n1", hgpus(4, "H100", 80, true)), mkNode("n2", hgpus(4, "H100", 80, true)),
		mkNode("n3", hgpus(4, "H100", 80, true)), mkNode("n4", hgpus(2, "H100", 80, false)),
	}
	base := Compute(View{Nodes: nodes, Deployments: deps})
	if len(base.Unplaced) != 0 {
		t.Fatalf("unplaced: %+v", base.Unplaced)
	}
	perms := [][]int{{3, 2, 1, 0}, {1, 3, 0, 2}, {2, 0, 3, 1}}
	for _, perm := range perms {
		var ns []Node
		for _, i := range perm {
			n := nodes[i]
			g := slices.Clone(n.GPUs)
			slices.Reverse(g)
			n.GPUs = g
			ns = append(ns, n)
		}
		d := slices.Clone(deps)
		slices.Reverse(d)
		p := Compute(View{Nodes: ns, Deployments: d})
		for _, rep := range []struct {
			id   string
			size int
			spec string
		}{{"big-0", 2, deps[0].SpecVersion()}, {"big-1", 2, deps[0].SpecVersion()}, {"wide-0", 3, deps[1].SpecVersion()}} {
			want, got := base.GangOf(rep.id, rep.spec, rep.size), p.GangOf(rep.id, rep.spec, rep.size)
			if !want.Equal(got) {
				t.Errorf("order %v: gang %s = %v, want %v", perm, rep.id, got.Nodes, want.Nodes)
			}
			if got.Rank0() == "" || slices.Contains(got.Nodes, "") {
				t.Errorf("gang %s not fully placed: %v", rep.id, got.Nodes)
			}
			// A gang's members are on distinct nodes.
			seen := map[string]bool{}
			for _, n := range got.Nodes {
				if seen[n] {
					t.Errorf("gang %s puts two ranks on %s: %v", rep.id, n, got.Nodes)
				}
				seen[n] = true
			}
		}
	}
}

func TestGangOfIgnoresOtherVersionsAndShards(t *testing.T) {
	p := Plan{Assignments: []Assignment{
		{ShardID: "m-0-s0", ReplicaID: "m-0", SpecVersion: "v1", Node: "a"},
		{ShardID: "m-0-s1", ReplicaID: "m-0", SpecVersion: "v1", Node: "b"},
		{ShardID: "m-0-s1", ReplicaID: "m-0", SpecVersion: "v2", Node: "c"},
		{ShardID: "m-0-s5", ReplicaID: "m-0", SpecVersion: "v1", Node: "d"},
	}}
	if g := p.GangOf("m-0", "v1", 2); !slices.Equal(g.Nodes, []string{"a", "b"}) || g.Rank0() != "a" {
		t.Errorf("v1 gang = %v", g.Nodes)
	}
	if g := p.GangOf("m-0", "v2", 2); !slices.Equal(g.Nodes, []string{"", "c"}) || g.Rank0() != "" {
		t.Errorf("v2 gang = %v", g.Nodes)
	}
}

// llama.cpp has no multi-node launch: a pipeline over nodes would start
// unrelated copies, so it is refused with the field and the fix named.
func TestLlamaCppPipelineRefused(t *testing.T) {
	d := Deployment{Name: "g", Model: "/w/m.gguf", Engine: "llamacpp", Replicas: 1, PipelineParallel: 2}
	err := d.WithDefaults().Validate()
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "pipeline_parallel" || !strings.Contains(err.Error(), "llama.cpp has no multi-node launch") ||
		!strings.Contains(err.Error(), "vllm or sglang") {
		t.Fatalf("err = %v, want a pipeline_parallel error naming the fix", err)
	}
	d.PipelineParallel = 1
	if err := d.WithDefaults().Validate(); err != nil {
		t.Fatalf("pp 1 llama.cpp refused: %v", err)
	}
	// Placement refuses it too, with the same words, rather than place two
	// unrelated copies.
	p := Compute(View{Nodes: []Node{mkNode("n1", hgpus(1, "H100", 80, false)), mkNode("n2", hgpus(1, "H100", 80, false))},
		Deployments: []Deployment{{Name: "g", Model: "/w/m.gguf", Engine: "llamacpp", Replicas: 1, PipelineParallel: 2}}})
	if len(p.Assignments) != 0 || len(p.Unplaced) == 0 || !strings.Contains(p.Unplaced[0].Reason, "no multi-node launch") {
		t.Fatalf("plan = %+v", p)
	}
}

// A TP 4 × PP 2 gang on three 4-GPU nodes cannot surge: the new version
// needs two free nodes while the old holds two. The reason says so, and
// how to do without; with update: recreate the old version is stopped
// first and the new one takes its place once its GPUs are free.
func TestGangUpdateSurgeOrRecreate(t *testing.T) {
	nodes := func() []Node {
		return []Node{mkNode("n1", hgpus(4, "H100", 80, true)), mkNode("n2", hgpus(4, "H100", 80, true)), mkNode("n3", hgpus(4, "H100", 80, true))}
	}
	old := mkDep("big", pp(2), tp(4))
	v0 := View{Nodes: nodes(), Deployments: []Deployment{old}}
	running := heldFromPlan(v0, Compute(v0), LeaseValid)

	for _, strategy := range []string{"", UpdateSurge, UpdateRecreate} {
		upd := mkDep("big", pp(2), tp(4), args("--max-model-len", "8192"))
		upd.Update = strategy
		if upd.SpecVersion() != mkDep("big", pp(2), tp(4), args("--max-model-len", "8192")).SpecVersion() {
			t.Fatalf("update %q changes the spec version", strategy)
		}
		v := running
		v.Deployments = []Deployment{upd}
		p := Compute(v)
		u, ok := unplaced(p, "big-0-s0")
		if !ok {
			t.Fatalf("update %q: the new gang was placed with no room: %+v", strategy, p.Assignments)
		}
		var olds int
		for _, a := range p.Assignments {
			if a.SpecVersion == old.SpecVersion() {
				olds++
				if !a.Draining {
					t.Errorf("update %q: old copy %s kept, not draining", strategy, a.ShardID)
				}
			}
		}
		if strategy == UpdateRecreate {
			if olds != 0 {
				t.Errorf("recreate keeps %d old shards serving; want them stopped first", olds)
			}
			if strings.Contains(u.Reason, "keeps serving") {
				t.Errorf("recreate reason %q", u.Reason)
			}
			// Once the old engines are gone from the records, the new
			// gang takes their nodes.
			gone := View{Nodes: nodes(), Deployments: []Deployment{upd}}
			if p := Compute(gone); len(p.Unplaced) != 0 || len(p.Assignments) != 2 {
				t.Errorf("recreate after the old stopped: %+v", p)
			}
			continue
		}
		if olds != 2 {
			t.Errorf("update %q: %d old shards draining, want 2 (surge keeps the old serving)", strategy, olds)
		}
		if !strings.Contains(u.Reason, "keeps serving meanwhile") || !strings.Contains(u.Reason, "update: recreate") {
			t.Errorf("update %q: reason %q does not say the surge waits, nor how to do without", strategy, u.Reason)
		}
	}
	bad := mkDep("big")
	bad.Update = "rolling"
	var fe *FieldError
	if err := bad.WithDefaults().Validate(); !errors.As(err, &fe) || fe.Field != "update" || !strings.Contains(err.Error(), "recreate") {
		t.Errorf("update rolling: %v", err)
	}
}

// A gang whose member keeps crashing (rank 0 reports Failing for the gang)
// is re-placed as a whole where another set of nodes fits, and kept where
// it is, every member, where none does.
func TestFailingGangMovesAsAWhole(t *testing.T) {
	dep := mkDep("big", pp(2), tp(4))
	v := dep.SpecVersion()
	failing := hold("big-0-s0", v, LeaseStarting, 1, 0, 1, 2, 3)
	failing.Failing = true
	member := hold("big-0-s1", v, LeaseStarting, 2, 0, 1, 2, 3)
	four := []Node{
		mkNode("n1", hgpus(4, "H100", 80, true), holding(failing)), mkNode("n2", hgpus(4, "H100", 80, true), holding(member)),
		mkNode("n3", hgpus(4, "H100", 80, true)), mkNode("n4", hgpus(4, "H100", 80, true)),
	}
	p := Compute(View{Nodes: four, Deployments: []Deployment{dep}})
	g := p.GangOf("big-0", v, 2)
	if slices.Contains(g.Nodes, "n1") || slices.Contains(g.Nodes, "n2") || slices.Contains(g.Nodes, "") {
		t.Fatalf("failing gang placed on %v, want both ranks on n3 and n4", g.Nodes)
	}
	p = Compute(View{Nodes: four[:2], Deployments: []Deployment{dep}})
	if g := p.GangOf("big-0", v, 2); !slices.Equal(g.Nodes, []string{"n1", "n2"}) {
		t.Fatalf("with nowhere else to go the gang is on %v, want kept on n1 and n2", g.Nodes)
	}
}
