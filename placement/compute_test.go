package placement

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestComputePlaces(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	tests := []struct {
		name  string
		view  View
		check func(t *testing.T, p Plan)
	}{
		{
			name: "one whole GPU",
			view: View{
				Nodes:       []Node{mkNode("n1", hgpus(2, h100, 80, true))},
				Deployments: []Deployment{mkDep("a")},
			},
			check: func(t *testing.T, p Plan) {
				wantAssigned(t, p, "a-0", "n1", 0)
			},
		},
		{
			name: "replicas spread over nodes before packing",
			view: View{
				Nodes: []Node{
					mkNode("n1", hgpus(8, h100, 80, true)),
					mkNode("n2", hgpus(8, h100, 80, true)),
					mkNode("n3", hgpus(8, h100, 80, true)),
				},
				Deployments: []Deployment{mkDep("a", replicas(3), memGiB(10))},
			},
			check: func(t *testing.T, p Plan) {
				nodes := map[string]bool{}
				for _, a := range p.Assignments {
					nodes[a.Node] = true
				}
				if len(nodes) != 3 {
					t.Errorf("replicas on %d nodes, want 3: %+v", len(nodes), p.Assignments)
				}
			},
		},
		{
			name: "pack into the fuller node and the fuller GPU",
			view: View{
				Nodes: []Node{
					mkNode("n1", hgpus(2, h100, 80, false)),
					mkNode("n2", hgpus(2, h100, 80, false), holding(
						HeldShard{ShardID: "other-0", SpecVersion: "x", GPUs: []int{1}, MemoryPerGPU: 60 * gib, Lease: LeaseValid})),
				},
				Deployments: []Deployment{mkDep("a", memGiB(20))},
			},
			check: func(t *testing.T, p Plan) {
				wantAssigned(t, p, "a-0", "n2", 1)
			},
		},
		{
			name: "tensor parallel prefers an NVLink pair",
			view: View{
				Nodes: []Node{
					// Pairs 0-1 and 2-3 are bridged; GPU 1 is taken.
					mkNode("n1", pairs(4, h100), holding(hold("other-0", "x", LeaseValid, 1, 1))),
				},
				Deployments: []Deployment{mkDep("a", tp(2))},
			},
			check: func(t *testing.T, p Plan) {
				wantAssigned(t, p, "a-0", "n1", 2, 3)
			},
		},
		{
			name: "cached weights attract",
			view: View{
				Nodes: []Node{
					mkNode("n1", hgpus(1, h100, 80, false)),
					mkNode("n2", hgpus(1, h100, 80, false), caching("org/a")),
					mkNode("n3", hgpus(1, h100, 80, false)),
				},
				Deployments: []Deployment{mkDep("a")},
			},
			check: func(t *testing.T, p Plan) {
				wantAssigned(t, p, "a-0", "n2", 0)
			},
		},
		{
			name: "gang on distinct nodes",
			view: View{
				Nodes: []Node{
					mkNode("n1", hgpus(8, h100, 80, true)),
					mkNode("n2", hgpus(8, h100, 80, true)),
				},
				Deployments: []Deployment{mkDep("big", pp(2), tp(8))},
			},
			check: func(t *testing.T, p Plan) {
				s0, s1 := find(p, "big-0-s0"), find(p, "big-0-s1")
				if len(s0) != 1 || len(s1) != 1 || s0[0].Node == s1[0].Node {
					t.Fatalf("gang not on two distinct nodes: %+v", p)
				}
				if len(s0[0].GPUs) != 8 {
					t.Errorf("shard has %d GPUs, want 8", len(s0[0].GPUs))
				}
			},
		},
		{
			name: "gang placed whole or not at all",
			view: View{
				Nodes:       []Node{mkNode("n1", hgpus(8, h100, 80, true))},
				Deployments: []Deployment{mkDep("big", pp(2), tp(4))},
			},
			check: func(t *testing.T, p Plan) {
				if len(p.Assignments) != 0 {
					t.Fatalf("half a gang placed: %+v", p.Assignments)
				}
				wantReason(t, p, "big-0-s0", "gang of 2 shards needs 2 distinct nodes with 4 whole GPUs each; only 1 fit")
				wantReason(t, p, "big-0-s1", "gang of 2 shards")
			},
		},
		{
			name: "whole GPU refuses foreign memory and our shards",
			view: View{
				Nodes: []Node{mkNode("n1", []GPU{
					{Index: 0, Name: h100, MemoryTotal: 80 * gib, MemoryForeign: 2 * gib},
					{Index: 1, Name: h100, MemoryTotal: 80 * gib},
					{Index: 2, Name: h100, MemoryTotal: 80 * gib, MemoryForeign: 512 << 20},
				}, holding(HeldShard{ShardID: "o-0", SpecVersion: "x", GPUs: []int{1}, MemoryPerGPU: gib, Lease: LeaseValid}))},
				Deployments: []Deployment{mkDep("a")},
			},
			check: func(t *testing.T, p Plan) {
				wantAssigned(t, p, "a-0", "n1", 2)
			},
		},
		{
			name: "faulted and MIG GPUs take nothing",
			view: View{
				Nodes: []Node{mkNode("n1", []GPU{
					{Index: 0, Name: h100, MemoryTotal: 80 * gib, Faulted: true},
					{Index: 1, Name: h100, MemoryTotal: 80 * gib, MIG: true},
					{Index: 2, Name: h100, MemoryTotal: 80 * gib},
				})},
				Deployments: []Deployment{mkDep("a", memGiB(10))},
			},
			check: func(t *testing.T, p Plan) {
				wantAssigned(t, p, "a-0", "n1", 2)
			},
		},
		{
			name: "dead nodes take nothing",
			view: View{
				Nodes: []Node{
					mkNode("n1", hgpus(8, h100, 80, true), dead),
					mkNode("n2", hgpus(1, h100, 80, true)),
				},
				Deployments: []Deployment{mkDep("a")},
			},
			check: func(t *testing.T, p Plan) {
				wantAssigned(t, p, "a-0", "n2", 0)
			},
		},
		{
			name: "GPU type is a case-insensitive substring",
			view: View{
				Nodes: []Node{
					mkNode("n1", hgpus(1, "NVIDIA A100-SXM4-80GB", 80, false)),
					mkNode("n2", hgpus(1, h100, 80, false)),
				},
				Deployments: []Deployment{mkDep("a", gpuType("h100"))},
			},
			check: func(t *testing.T, p Plan) {
				wantAssigned(t, p, "a-0", "n2", 0)
			},
		},
		{
			name: "labels must all match",
			view: View{
				Nodes: []Node{
					mkNode("n1", hgpus(1, h100, 80, false), withLabels("zone", "a")),
					mkNode("n2", hgpus(1, h100, 80, false), withLabels("zone", "a", "tier", "gold")),
					mkNode("n3", hgpus(1, h100, 80, false), withLabels("zone", "b", "tier", "gold")),
				},
				Deployments: []Deployment{mkDep("a", labels("zone", "a", "tier", "gold"))},
			},
			check: func(t *testing.T, p Plan) {
				wantAssigned(t, p, "a-0", "n2", 0)
			},
		},
		{
			name: "replicas zero places nothing",
			view: View{
				Nodes: []Node{mkNode("n1", hgpus(1, h100, 80, false),
					holding(hold("a-0", version(mkDep("a", replicas(0))), LeaseValid, 1, 0)))},
				Deployments: []Deployment{mkDep("a", replicas(0))},
			},
			check: func(t *testing.T, p Plan) {
				if len(p.Assignments)+len(p.Unplaced) != 0 {
					t.Fatalf("want an empty plan, got %+v", p)
				}
			},
		},
		{
			name: "larger gangs go first",
			view: View{
				Nodes: []Node{mkNode("n1", hgpus(4, h100, 80, true))},
				Deployments: []Deployment{
					mkDep("a-small", replicas(4)),
					mkDep("z-big", tp(4)),
				},
			},
			check: func(t *testing.T, p Plan) {
				wantAssigned(t, p, "z-big-0", "n1", 0, 1, 2, 3)
				for i := range 4 {
					if _, ok := unplaced(p, ReplicaID("a-small", i)); !ok {
						t.Errorf("a-small-%d placed, want the big gang first", i)
					}
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Compute(tt.view)
			tt.check(t, p)
			checkInvariants(t, tt.view, p)
		})
	}
}

// pairs is n GPUs bridged two by two (PCIe H100 NVL style).
func pairs(n int, name string) []GPU {
	gs := hgpus(n, name, 80, false)
	for i := 0; i+1 < n; i += 2 {
		gs[i].NVLinkPeers = []int{i + 1}
		gs[i+1].NVLinkPeers = []int{i}
	}
	return gs
}

func wantAssigned(t *testing.T, p Plan, shard, node string, gpus ...int) {
	t.Helper()
	as := find(p, shard)
	if len(as) != 1 {
		t.Fatalf("%s: %d assignments, want 1; plan %+v", shard, len(as), p)
	}
	if as[0].Node != node || !slices.Equal(as[0].GPUs, gpus) {
		t.Fatalf("%s on %s %v, want %s %v", shard, as[0].Node, as[0].GPUs, node, gpus)
	}
}

func wantReason(t *testing.T, p Plan, shard, want string) {
	t.Helper()
	u, ok := unplaced(p, shard)
	if !ok {
		t.Fatalf("%s placed, want unplaced with %q; plan %+v", shard, want, p)
	}
	if !strings.Contains(u.Reason, want) {
		t.Fatalf("%s reason %q, want it to contain %q", shard, u.Reason, want)
	}
}

func TestComputeReasons(t *testing.T) {
	h100, a100 := "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"
	three := []Node{
		mkNode("n1", hgpus(2, h100, 80, true), withLabels("zone", "b")),
		mkNode("n2", hgpus(4, a100, 40, true), withLabels("zone", "b")),
		mkNode("n3", hgpus(1, h100, 80, true), withLabels("zone", "b")),
	}
	tests := []struct {
		name  string
		nodes []Node
		dep   Deployment
		want  string
	}{
		{"empty cluster", nil, mkDep("a"), "no nodes in the cluster view"},
		{"all dead", []Node{mkNode("n1", hgpus(1, h100, 80, false), dead)}, mkDep("a"),
			"no live node (1 in the view, none alive)"},
		{"labels", three, mkDep("a", labels("zone", "a")),
			"no live node matches labels zone=a (3 nodes checked)"},
		{"gpu type", three, mkDep("a", gpuType("B200")),
			`no live node has a GPU matching "B200" (3 nodes checked; GPUs seen: NVIDIA A100-SXM4-40GB, NVIDIA H100 80GB HBM3)`},
		{"too few GPUs of the type", three, mkDep("a", gpuType("H100"), tp(4)),
			"needs 4 H100 GPUs on one node that are neither MIG-enabled nor faulted; best node n1 has 2 (2 nodes checked)"},
		{"memory", three, mkDep("a", gpuType("H100"), tp(2), memGiB(90)),
			"needs 2 GPUs with 90GiB free (H100); best node n1 has 0 (1 node checked)"},
		{"memory partly free", []Node{
			mkNode("n1", hgpus(4, h100, 80, true), holding(
				HeldShard{ShardID: "o-0", SpecVersion: "x", GPUs: []int{0, 1}, MemoryPerGPU: 40 * gib, Lease: LeaseValid})),
			mkNode("n3", hgpus(4, h100, 80, true), holding(
				HeldShard{ShardID: "o-1", SpecVersion: "x", GPUs: []int{0, 1, 2}, MemoryPerGPU: 40 * gib, Lease: LeaseValid})),
		}, mkDep("a", gpuType("H100"), tp(4), memGiB(70)),
			"needs 4 GPUs with 70GiB free (H100); best node n1 has 2 (2 nodes checked)"},
		{"MIG", []Node{mkNode("n1", []GPU{
			{Index: 0, Name: h100, MemoryTotal: 80 * gib, MIG: true},
			{Index: 1, Name: h100, MemoryTotal: 80 * gib, MIG: true},
		})}, mkDep("a", tp(2)), "2 MIG-enabled GPUs take nothing new"},
		{"whole GPU busy", []Node{mkNode("n1", []GPU{{Index: 0, Name: h100, MemoryTotal: 80 * gib, MemoryForeign: 3 * gib}})},
			mkDep("a"), "needs 1 whole GPU; best node n1 has 0 (1 node checked); a whole GPU must hold no shard of ours and at most 1GiB of other processes' memory"},
		{"no GPUs at all", []Node{mkNode("n1", nil), mkNode("n2", nil)}, mkDep("a"),
			"no live node has any GPU (2 nodes checked)"},
		{"one faulted GPU", []Node{mkNode("n1", []GPU{{Index: 0, Name: h100, MemoryTotal: 80 * gib, Faulted: true}})},
			mkDep("a"), "1 GPU with recent driver faults takes nothing new"},
		{"invalid", three, mkDep("Bad_Name"), "invalid deployment: name: invalid value"},
		{"every replica that does not fit says why", []Node{mkNode("n1", hgpus(1, h100, 80, false))},
			mkDep("a", replicas(3)), "needs 1 whole GPU; best node n1 has 0 (1 node checked)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := View{Nodes: tt.nodes, Deployments: []Deployment{tt.dep}}
			p := Compute(v)
			if len(p.Unplaced) == 0 {
				t.Fatalf("placed, want %q: %+v", tt.want, p)
			}
			for _, u := range p.Unplaced {
				if !strings.Contains(u.Reason, tt.want) {
					t.Errorf("%s: reason %q\nwant it to contain %q", u.ShardID, u.Reason, tt.want)
				}
			}
			checkInvariants(t, v, p)
		})
	}
}

func TestKeepWhatRuns(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	d := mkDep("a", memGiB(20))
	v := version(d)
	nodes := func(lease LeaseState, alive bool, failing bool) View {
		held := hold("a-0", v, lease, 1, 3)
		held.MemoryPerGPU = 20 * gib
		held.Failing = failing
		n2 := mkNode("n2", hgpus(4, h100, 80, false), holding(held))
		n2.Alive = alive
		return View{
			// n1 is fuller, so a fresh placement would prefer it.
			Nodes: []Node{
				mkNode("n1", hgpus(1, h100, 80, false), holding(HeldShard{ShardID: "o-0", SpecVersion: "x", GPUs: []int{0}, MemoryPerGPU: 50 * gib, Lease: LeaseValid})),
				n2,
			},
			Deployments: []Deployment{d},
		}
	}
	t.Run("valid lease stays, even where it would not go today", func(t *testing.T) {
		p := Compute(nodes(LeaseValid, true, false))
		wantAssigned(t, p, "a-0", "n2", 3)
		if a := find(p, "a-0")[0]; !a.Kept || a.MemoryPerGPU != 20*gib {
			t.Fatalf("want kept with 20GiB, got %+v", a)
		}
	})
	t.Run("starting lease stays", func(t *testing.T) {
		p := Compute(nodes(LeaseStarting, true, false))
		wantAssigned(t, p, "a-0", "n2", 3)
	})
	t.Run("lapsed lease is re-placed and its GPU still counts", func(t *testing.T) {
		p := Compute(nodes(LeaseLapsed, true, false))
		a := find(p, "a-0")
		if len(a) != 1 || a[0].Kept || a[0].Node != "n1" {
			t.Fatalf("want re-placed on the fuller n1, got %+v", a)
		}
	})
	t.Run("dead holder is re-placed", func(t *testing.T) {
		p := Compute(nodes(LeaseValid, false, false))
		if a := find(p, "a-0"); len(a) != 1 || a[0].Node != "n1" || a[0].Kept {
			t.Fatalf("want re-placed on n1, got %+v", a)
		}
	})
	t.Run("failing shard moves", func(t *testing.T) {
		p := Compute(nodes(LeaseValid, true, true))
		if a := find(p, "a-0"); len(a) != 1 || a[0].Node != "n1" || a[0].Kept {
			t.Fatalf("want moved to n1, got %+v", a)
		}
	})
	t.Run("failing shard stays when nothing else fits", func(t *testing.T) {
		view := nodes(LeaseValid, true, true)
		view.Nodes = view.Nodes[1:]
		p := Compute(view)
		if a := find(p, "a-0"); len(a) != 1 || a[0].Node != "n2" || !a[0].Kept || !slices.Equal(a[0].GPUs, []int{3}) {
			t.Fatalf("want it kept where it is, got %+v", a)
		}
	})
	t.Run("scaled down replicas stop", func(t *testing.T) {
		view := nodes(LeaseValid, true, false)
		view.Nodes[1].Shards = append(view.Nodes[1].Shards, hold("a-1", v, LeaseValid, 2, 2))
		p := Compute(view)
		if len(find(p, "a-1")) != 0 {
			t.Fatalf("a-1 is beyond replicas and still assigned: %+v", p)
		}
	})
	t.Run("deleted deployment stops", func(t *testing.T) {
		view := nodes(LeaseValid, true, false)
		view.Deployments = nil
		if p := Compute(view); len(p.Assignments) != 0 {
			t.Fatalf("want nothing, got %+v", p)
		}
	})
}

func TestDuplicatesAfterPartition(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	d := mkDep("a")
	v := version(d)
	tests := []struct {
		name           string
		stamp1, stamp2 int64
		lease1, lease2 LeaseState
		want           string
	}{
		{"earliest claim wins", 5, 3, LeaseValid, LeaseValid, "n2"},
		{"equal claims: lower name", 3, 3, LeaseValid, LeaseValid, "n1"},
		{"starting counts as a claim", 1, 3, LeaseStarting, LeaseStarting, "n1"},
		// A replacement may load for minutes: the copy that answers stays.
		{"a serving copy beats an earlier one still loading", 1, 3, LeaseStarting, LeaseValid, "n2"},
		{"lapsed does not", 1, 3, LeaseLapsed, LeaseValid, "n2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			view := View{
				Nodes: []Node{
					mkNode("n1", hgpus(1, h100, 80, false), holding(hold("a-0", v, tt.lease1, tt.stamp1, 0))),
					mkNode("n2", hgpus(1, h100, 80, false), holding(hold("a-0", v, tt.lease2, tt.stamp2, 0))),
				},
				Deployments: []Deployment{d},
			}
			p := Compute(view)
			a := find(p, "a-0")
			if len(a) != 1 || a[0].Node != tt.want || !a[0].Kept {
				t.Fatalf("want kept on %s only, got %+v", tt.want, a)
			}
		})
	}
}

// TestSurgeThenDrain walks a rolling change step by step: the new version is
// placed beside the old, the old keeps serving while the new one starts, and
// goes only once the new one is ready.
func TestSurgeThenDrain(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	d1 := mkDep("a", replicas(2), memGiB(30))
	d2 := mkDep("a", replicas(2), memGiB(30), args("--max-model-len=8192"))
	v1, v2 := version(d1), version(d2)
	view := View{
		Nodes: []Node{
			mkNode("n1", hgpus(1, h100, 80, false)),
			mkNode("n2", hgpus(1, h100, 80, false)),
		},
		Deployments: []Deployment{d1},
	}
	p := Compute(view)
	view = heldFromPlan(view, p, LeaseValid)

	// Spec change: surge.
	view.Deployments = []Deployment{d2}
	p = Compute(view)
	for _, id := range []string{"a-0", "a-1"} {
		as := find(p, id)
		if len(as) != 2 {
			t.Fatalf("%s: want old and new, got %+v", id, as)
		}
		old, nu := as[0], as[1]
		if old.SpecVersion != v1 {
			old, nu = nu, old
		}
		if old.SpecVersion != v1 || !old.Draining || !old.Kept {
			t.Fatalf("%s: old not kept draining: %+v", id, old)
		}
		if nu.SpecVersion != v2 || nu.Kept || nu.Draining {
			t.Fatalf("%s: new not placed fresh: %+v", id, nu)
		}
		if nu.Node == old.Node {
			t.Errorf("%s: new version on the old one's node %s although the other node fits", id, nu.Node)
		}
	}
	checkInvariants(t, view, p)

	// The new engines are starting: the old ones keep serving.
	starting := heldFromPlan(view, p, LeaseValid)
	for i := range starting.Nodes {
		for j := range starting.Nodes[i].Shards {
			if s := &starting.Nodes[i].Shards[j]; s.SpecVersion == v2 {
				s.Lease = LeaseStarting
			}
		}
	}
	p = Compute(starting)
	if n := countVersion(p, v1); n != 2 {
		t.Fatalf("old version kept %d times while new starts, want 2: %+v", n, p)
	}

	// New ready: old ones get no assignment.
	ready := heldFromPlan(starting, p, LeaseValid)
	p = Compute(ready)
	if n := countVersion(p, v1); n != 0 {
		t.Fatalf("old version still assigned after new is ready: %+v", p)
	}
	if n := countVersion(p, v2); n != 2 {
		t.Fatalf("new version assigned %d times, want 2", n)
	}
}

func TestSurgeWithoutRoom(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	d1 := mkDep("a", memGiB(60))
	d2 := mkDep("a", memGiB(60), args("--x"))
	view := View{
		Nodes:       []Node{mkNode("n1", hgpus(1, h100, 80, false))},
		Deployments: []Deployment{d1},
	}
	view = heldFromPlan(view, Compute(view), LeaseValid)
	view.Deployments = []Deployment{d2}
	p := Compute(view)
	a := find(p, "a-0")
	if len(a) != 1 || a[0].SpecVersion != version(d1) || !a[0].Draining {
		t.Fatalf("want the old version serving, got %+v", a)
	}
	wantReason(t, p, "a-0", "new version "+version(d2)+": needs 1 GPU with 60GiB free")
	wantReason(t, p, "a-0", "version "+version(d1)+" keeps serving meanwhile")
}

func TestPipelineChangeDrainsOldShards(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	d1 := mkDep("a", tp(2))
	d2 := mkDep("a", tp(2), pp(2))
	view := View{
		Nodes: []Node{
			mkNode("n1", hgpus(4, h100, 80, true)),
			mkNode("n2", hgpus(4, h100, 80, true)),
			mkNode("n3", hgpus(4, h100, 80, true)),
		},
		Deployments: []Deployment{d1},
	}
	view = heldFromPlan(view, Compute(view), LeaseValid)
	view.Deployments = []Deployment{d2}
	p := Compute(view)
	if a := find(p, "a-0"); len(a) != 1 || !a[0].Draining {
		t.Fatalf("old single shard should drain: %+v", a)
	}
	if len(find(p, "a-0-s0")) != 1 || len(find(p, "a-0-s1")) != 1 {
		t.Fatalf("new pipeline not placed: %+v", p)
	}
}

func TestPartialGang(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	d := mkDep("a", pp(3), tp(4))
	v := version(d)
	view := View{
		Nodes: []Node{
			mkNode("n1", hgpus(8, h100, 80, true), holding(hold("a-0-s0", v, LeaseValid, 1, 0, 1, 2, 3))),
			mkNode("n2", hgpus(8, h100, 80, true), holding(hold("a-0-s1", v, LeaseLapsed, 1, 0, 1, 2, 3))),
			mkNode("n3", hgpus(8, h100, 80, true)),
		},
		Deployments: []Deployment{d},
	}
	p := Compute(view)
	s0, s1, s2 := find(p, "a-0-s0"), find(p, "a-0-s1"), find(p, "a-0-s2")
	if len(s0) != 1 || !s0[0].Kept || s0[0].Node != "n1" {
		t.Fatalf("kept shard moved: %+v", s0)
	}
	if len(s1) != 1 || len(s2) != 1 || s1[0].Node == "n1" || s2[0].Node == "n1" || s1[0].Node == s2[0].Node {
		t.Fatalf("missing shards not on distinct other nodes: %+v %+v", s1, s2)
	}

	// Only the kept shard's node is left: keep it, explain the others.
	view.Nodes = view.Nodes[:1]
	p = Compute(view)
	if s0 := find(p, "a-0-s0"); len(s0) != 1 || !s0[0].Kept {
		t.Fatalf("kept shard dropped: %+v", p)
	}
	wantReason(t, p, "a-0-s1", "gang of 3 shards needs 2 distinct nodes with 4 whole GPUs each; only 0 fit besides n1, where its other shards stay")
}

func TestForNode(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	view := View{
		Nodes: []Node{
			mkNode("n1", hgpus(2, h100, 80, false)),
			mkNode("n2", hgpus(2, h100, 80, false)),
		},
		Deployments: []Deployment{mkDep("a", replicas(2)), mkDep("b", replicas(2))},
	}
	p := Compute(view)
	var all []Assignment
	for _, n := range []string{"n1", "n2"} {
		for _, a := range p.ForNode(n) {
			if a.Node != n {
				t.Fatalf("ForNode(%s) returned %+v", n, a)
			}
			all = append(all, a)
		}
	}
	if len(all) != 4 {
		t.Fatalf("ForNode covers %d of 4 assignments", len(all))
	}
	if p.ForNode("nope") != nil {
		t.Fatal("unknown node has assignments")
	}
}

func TestEmptyPlanMarshalsLists(t *testing.T) {
	if got := mustJSON(t, Compute(View{})); got != `{"assignments":[],"unplaced":[]}` {
		t.Fatalf("got %s", got)
	}
}

func countVersion(p Plan, v string) int {
	n := 0
	for _, a := range p.Assignments {
		if a.SpecVersion == v {
			n++
		}
	}
	return n
}

func TestLexOrder(t *testing.T) {
	for _, n := range []int{0, 1, 2, 9, 10, 11, 99, 100, 101, 1000, 1234} {
		got := lexOrder(n)
		if len(got) != n {
			t.Fatalf("lexOrder(%d) has %d entries", n, len(got))
		}
		for i := 1; i < len(got); i++ {
			a, b := ReplicaID("d", got[i-1]), ReplicaID("d", got[i])
			if a >= b {
				t.Fatalf("lexOrder(%d): %s before %s", n, a, b)
			}
		}
	}
}

// TestLargeClusterConverges runs the benchmark cluster at a tenth of its
// size through the invariants, then loses a node: only that node's shards
// move, and they go elsewhere.
func TestLargeClusterConverges(t *testing.T) {
	v := View{Nodes: benchCluster(1250), Deployments: benchDeployments(1000)}
	p := Compute(v)
	checkInvariants(t, v, p)
	if len(p.Unplaced) != 0 {
		t.Fatalf("%d shards unplaced in a cluster with room: first %+v", len(p.Unplaced), p.Unplaced[0])
	}
	held := heldFromPlan(v, p, LeaseValid)
	again := Compute(held)
	if mustJSON(t, again.Assignments) == mustJSON(t, p.Assignments) {
		t.Fatal("converged plan should mark everything kept")
	}
	for _, a := range again.Assignments {
		if !a.Kept {
			t.Fatalf("%s not kept in a converged cluster", a.ShardID)
		}
	}

	busiest := 0
	for i, n := range held.Nodes {
		if len(n.Shards) > len(held.Nodes[busiest].Shards) {
			busiest = i
		}
	}
	lost := held.Nodes[busiest].Name
	held.Nodes[busiest].Alive = false
	replan := Compute(held)
	checkInvariants(t, held, replan)
	before := map[string]Assignment{}
	for _, a := range p.Assignments {
		before[a.ShardID] = a
	}
	moved := 0
	for _, a := range replan.Assignments {
		b := before[a.ShardID]
		switch {
		case b.Node == lost:
			moved++
			if a.Node == lost || a.Kept {
				t.Errorf("%s still on the lost node", a.ShardID)
			}
		case a.Node != b.Node || !slices.Equal(a.GPUs, b.GPUs) || !a.Kept:
			t.Errorf("%s moved from %s to %s although its node lives", a.ShardID, b.Node, a.Node)
		}
	}
	if moved == 0 || len(replan.Unplaced) != 0 {
		t.Fatalf("moved %d, unplaced %d", moved, len(replan.Unplaced))
	}
}

// Among equal nodes the rendezvous hash of shard and node decides, so a
// node joining changes the choice only if it wins the hash itself.
func TestTieBreakIsRendezvous(t *testing.T) {
	var v View
	best, bestH := "", uint64(0)
	for i := range 6 {
		name := ReplicaID("node", i)
		v.Nodes = append(v.Nodes, mkNode(name, hgpus(1, "NVIDIA H100 80GB HBM3", 80, false)))
		if h := rendezvous(fnv1a("a-0"), nodeKey(name)); h > bestH {
			best, bestH = name, h
		}
	}
	v.Deployments = []Deployment{mkDep("a")}
	wantAssigned(t, Compute(v), "a-0", best, 0)
	for i := 6; i < 20; i++ {
		name := ReplicaID("node", i)
		v.Nodes = append(v.Nodes, mkNode(name, hgpus(1, "NVIDIA H100 80GB HBM3", 80, false)))
		if h := rendezvous(fnv1a("a-0"), nodeKey(name)); h > bestH {
			best, bestH = name, h
		}
		wantAssigned(t, Compute(v), "a-0", best, 0)
	}
}

// A kept shard of the current version is planned with its spec's memory
// per GPU even when its holder lost the figure (an agent restarted from an
// older state file reports 0, "whole GPUs"): the next round counts the
// right amount, and the rest of the GPU is usable again.
func TestKeptShardGetsItsSpecsMemoryBack(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	a := mkDep("a", memGiB(20))
	b := mkDep("b", memGiB(20))
	held := hold("a-0", version(a), LeaseValid, 1, 0) // MemoryPerGPU lost: 0
	view := View{
		Nodes:       []Node{mkNode("n1", hgpus(1, h100, 80, false), holding(held))},
		Deployments: []Deployment{a, b},
	}
	p := Compute(view)
	got := find(p, "a-0")
	if len(got) != 1 || !got[0].Kept || got[0].MemoryPerGPU != 20<<30 {
		t.Fatalf("kept a-0 = %+v, want 20GiB per GPU", got)
	}
	// The node then reports what the plan told it; b fits beside a.
	view = heldFromPlan(view, p, LeaseValid)
	p = Compute(view)
	if bs := find(p, "b-0"); len(bs) != 1 {
		u, _ := unplaced(p, "b-0")
		t.Fatalf("b-0 not placed beside a-0: %s", u.Reason)
	}
}

// Scaling down keeps the removed replicas serving, draining, until every
// replica that remains is ready: 3→1 with replica 0's node dead must not
// stop the two replicas that serve while replica 0 starts over.
func TestScaleDownDrainsUntilTheRestIsReady(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	three, one := mkDep("a", replicas(3)), mkDep("a", replicas(1))
	view := View{
		Nodes: []Node{
			mkNode("n1", hgpus(2, h100, 80, false)),
			mkNode("n2", hgpus(2, h100, 80, false)),
			mkNode("n3", hgpus(2, h100, 80, false)),
		},
		Deployments: []Deployment{three},
	}
	view = heldFromPlan(view, Compute(view), LeaseValid)
	holderOf := func(shard string) string {
		for _, n := range view.Nodes {
			for _, s := range n.Shards {
				if s.ShardID == shard {
					return n.Name
				}
			}
		}
		return ""
	}
	// Replica 0's node dies; its lease lapses.
	for i := range view.Nodes {
		if view.Nodes[i].Name == holderOf("a-0") {
			view.Nodes[i].Alive = false
			for j := range view.Nodes[i].Shards {
				view.Nodes[i].Shards[j].Lease = LeaseLapsed
			}
		}
	}
	view.Deployments = []Deployment{one}
	p := Compute(view)
	for _, id := range []string{"a-1", "a-2"} {
		a := find(p, id)
		if len(a) != 1 || !a[0].Draining || a[0].Node != holderOf(id) {
			t.Fatalf("%s = %+v, want it kept draining where it serves", id, a)
		}
	}
	a0 := find(p, "a-0")
	if len(a0) != 1 || a0[0].Kept || a0[0].Draining {
		t.Fatalf("a-0 = %+v, want it placed anew", a0)
	}
	// Once replica 0 serves again, the removed replicas go.
	view = heldFromPlan(view, p, LeaseValid)
	p = Compute(view)
	if len(find(p, "a-1")) != 0 || len(find(p, "a-2")) != 0 {
		t.Fatalf("removed replicas still planned once a-0 is ready: %+v", p.Assignments)
	}
	if a := find(p, "a-0"); len(a) != 1 || !a[0].Kept {
		t.Fatalf("a-0 = %+v, want it kept", a)
	}
}

// A shard on a GPU with recent driver faults moves, surge-then-drain: the
// faulted copy serves until its replacement is ready. With nowhere to go
// it stays, once.
func TestShardOnFaultedGPUMovesAfterItsReplacementIsReady(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	a := mkDep("a")
	bad := hgpus(1, h100, 80, false)
	bad[0].Faulted = true
	n1 := mkNode("n1", bad, holding(hold("a-0", version(a), LeaseValid, 1, 0)))

	alone := Compute(View{Nodes: []Node{n1}, Deployments: []Deployment{a}})
	if got := find(alone, "a-0"); len(got) != 1 || !got[0].Kept || got[0].Draining || got[0].Node != "n1" {
		t.Fatalf("with nowhere to go: %+v, want a-0 kept on n1 once", got)
	}

	view := View{Nodes: []Node{n1, mkNode("n2", hgpus(1, h100, 80, false))}, Deployments: []Deployment{a}}
	p := Compute(view)
	got := find(p, "a-0")
	if len(got) != 2 {
		t.Fatalf("round 1: %+v, want the faulted copy draining and a new one", got)
	}
	for _, g := range got {
		if (g.Node == "n1") != g.Draining || (g.Node == "n2") == g.Kept {
			t.Fatalf("round 1: %+v, want n1 draining and n2 newly placed", got)
		}
	}
	// n2 starts its copy: n1's keeps serving.
	view.Nodes[1].Shards = []HeldShard{hold("a-0", version(a), LeaseStarting, 2, 0)}
	if got := find(Compute(view), "a-0"); len(got) != 2 {
		t.Fatalf("round 2: %+v, want both copies until n2's is ready", got)
	}
	// n2's copy is ready: n1's goes.
	view.Nodes[1].Shards[0].Lease = LeaseValid
	if got := find(Compute(view), "a-0"); len(got) != 1 || got[0].Node != "n2" || !got[0].Kept {
		t.Fatalf("round 3: %+v, want a-0 on n2 only", got)
	}
}

// An old-version shard that serves (valid lease) drains on a spec change
// even if its engine crashed often before: the flag clears only after a
// stable stretch, and stopping it early would drop a serving replica.
func TestServingOldVersionDrainsEvenIfFlaggedFailing(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	d1, d2 := mkDep("a"), mkDep("a", args("--x"))
	old := hold("a-0", version(d1), LeaseValid, 1, 0)
	old.Failing = true
	view := View{
		Nodes:       []Node{mkNode("n1", hgpus(1, h100, 80, false), holding(old)), mkNode("n2", hgpus(1, h100, 80, false))},
		Deployments: []Deployment{d2},
	}
	p := Compute(view)
	var drained bool
	for _, a := range find(p, "a-0") {
		drained = drained || (a.SpecVersion == version(d1) && a.Draining && a.Node == "n1")
	}
	if !drained {
		t.Fatalf("a-0 = %+v, want the serving old version draining on n1", find(p, "a-0"))
	}
}

// Scaled-away replicas drain only while the replica asked for can be
// placed: when they hold the only capacity it needs, they stop at once,
// and it is placed the round after.
func TestScaleDownReleasesCapacityTheRemainingReplicaNeeds(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	three, one := mkDep("a", replicas(3)), mkDep("a", replicas(1))
	view := View{
		Nodes: []Node{
			mkNode("n1", hgpus(1, h100, 80, false)),
			mkNode("n2", hgpus(1, h100, 80, false)),
			mkNode("n3", hgpus(1, h100, 80, false)),
		},
		Deployments: []Deployment{three},
	}
	view = heldFromPlan(view, Compute(view), LeaseValid)
	for i := range view.Nodes {
		if len(view.Nodes[i].Shards) > 0 && view.Nodes[i].Shards[0].ShardID == "a-0" {
			view.Nodes[i].Alive = false
			view.Nodes[i].Shards[0].Lease = LeaseLapsed
		}
	}
	view.Deployments = []Deployment{one}
	p := Compute(view)
	if len(find(p, "a-1")) != 0 || len(find(p, "a-2")) != 0 {
		t.Fatalf("removed replicas kept although a-0 has nowhere to go: %+v", p.Assignments)
	}
	u, ok := unplaced(p, "a-0")
	if !ok || !strings.Contains(u.Reason, "stopped to make room") {
		t.Fatalf("a-0 unplaced reason = %q, want it to say the removed replicas make room", u.Reason)
	}
	// Their nodes stop them; a-0 fits the round after.
	for i := range view.Nodes {
		if view.Nodes[i].Alive {
			view.Nodes[i].Shards = nil
		}
	}
	if got := find(Compute(view), "a-0"); len(got) != 1 {
		t.Fatalf("a-0 not placed once the capacity is free: %+v", got)
	}
}

// Two holders of one shard on faulted GPUs, nowhere else to go: one is
// kept, and the other is not kept draining forever.
func TestFaultedDuplicateDoesNotDrainForever(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	a := mkDep("a")
	bad := func() []GPU { g := hgpus(1, h100, 80, false); g[0].Faulted = true; return g }
	view := View{
		Nodes: []Node{
			mkNode("n1", bad(), holding(hold("a-0", version(a), LeaseValid, 1, 0))),
			mkNode("n2", bad(), holding(hold("a-0", version(a), LeaseValid, 2, 0))),
		},
		Deployments: []Deployment{a},
	}
	got := find(Compute(view), "a-0")
	if len(got) != 1 || got[0].Node != "n1" || got[0].Draining {
		t.Fatalf("a-0 = %+v, want it kept once, on n1 (earliest claim)", got)
	}
}

// A copy that serves keeps draining until what replaces it has served long
// enough for every node to know (HeldShard.Settling): a rolling update, a
// gang's, a scale-down and a move off a faulted GPU alike. Otherwise the
// old copy's holder could stop it while gateways still see only it.
func TestACopyDrainsUntilItsReplacementSettles(t *testing.T) {
	h100 := "NVIDIA H100 80GB HBM3"
	nodes := func(n int, gpus func() []GPU) []Node {
		var out []Node
		for i := range n {
			out = append(out, mkNode(fmt.Sprintf("n%d", i+1), gpus()))
		}
		return out
	}
	one := func() []GPU { return hgpus(1, h100, 80, false) }
	// held is the view once from's plan serves, every copy valid.
	held := func(ns []Node, from Deployment) View {
		v := View{Nodes: ns, Deployments: []Deployment{from}}
		return heldFromPlan(v, Compute(v), LeaseValid)
	}
	v1, v1pp := version(mkDep("a", replicas(2))), version(mkDep("a", pp(2), tp(2)))
	for _, tt := range []struct {
		name string
		view func() View
		to   Deployment
		// old says whether an assignment is a copy that must drain.
		old func(a Assignment) bool
	}{
		{"rolling update", func() View { return held(nodes(4, one), mkDep("a", replicas(2))) },
			mkDep("a", replicas(2), args("--x")), func(a Assignment) bool { return a.SpecVersion == v1 }},
		{"gang update", func() View {
			return held(nodes(4, func() []GPU { return hgpus(2, h100, 80, true) }), mkDep("a", pp(2), tp(2)))
		}, mkDep("a", pp(2), tp(2), args("--x")), func(a Assignment) bool { return a.SpecVersion == v1pp }},
		// Scaled from three to one while replica 0 is placed anew (its
		// node had died): the two removed ones serve until it is ready.
		{"scale down", func() View {
			ns := nodes(3, one)
			ns[1].Shards = []HeldShard{hold("a-1", version(mkDep("a")), LeaseValid, 1, 0)}
			ns[2].Shards = []HeldShard{hold("a-2", version(mkDep("a")), LeaseValid, 2, 0)}
			return View{Nodes: ns}
		}, mkDep("a"), func(a Assignment) bool { return a.ReplicaID != "a-0" }},
		{"faulted GPU", func() View {
			bad := one()
			bad[0].Faulted = true
			n1 := mkNode("n1", bad, holding(hold("a-0", version(mkDep("a")), LeaseValid, 1, 0)))
			return View{Nodes: []Node{n1, mkNode("n2", one())}}
		}, mkDep("a"), func(a Assignment) bool { return a.Node == "n1" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			view := tt.view()
			view.Deployments = []Deployment{tt.to}
			had := map[string]bool{}
			for _, n := range view.Nodes {
				for _, s := range n.Shards {
					had[n.Name+"/"+s.ShardID+"/"+s.SpecVersion] = true
				}
			}
			olds := func(p Plan) int {
				n := 0
				for _, a := range p.Assignments {
					if tt.old(a) {
						if !a.Draining {
							t.Fatalf("old copy %+v planned but not draining", a)
						}
						n++
					}
				}
				return n
			}
			p := Compute(view)
			want := olds(p)
			if want == 0 {
				t.Fatalf("no copy drains to begin with: %+v", p.Assignments)
			}
			// The replacements serve, but this node saw them valid only now.
			next := heldFromPlan(view, p, LeaseValid)
			for i := range next.Nodes {
				for j := range next.Nodes[i].Shards {
					s := &next.Nodes[i].Shards[j]
					s.Settling = !had[next.Nodes[i].Name+"/"+s.ShardID+"/"+s.SpecVersion]
				}
			}
			if got := olds(Compute(next)); got != want {
				t.Fatalf("%d old copies planned while their replacements settle, want %d", got, want)
			}
			for i := range next.Nodes {
				for j := range next.Nodes[i].Shards {
					next.Nodes[i].Shards[j].Settling = false
				}
			}
			if got := olds(Compute(next)); got != 0 {
				t.Fatalf("%d old copies still planned once their replacements settled", got)
			}
		})
	}
}
