package placement

import (
	"encoding/json"
	"fmt"
)

// Fixture builders, in the spirit of Nomad's mock.Node: a test says what is
// special about its cluster and nothing else.

const gib = 1 << 30

// hgpus returns n H100-like GPUs of memGiB each, all joined by NVLink
// (NVSwitch) when nvlink is set.
func hgpus(n int, name string, memGiB uint64, nvlink bool) []GPU {
	out := make([]GPU, n)
	for i := range out {
		out[i] = GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Name: name, MemoryTotal: memGiB * gib}
		if nvlink {
			for j := range n {
				if j != i {
					out[i].NVLinkPeers = append(out[i].NVLinkPeers, j)
				}
			}
		}
	}
	return out
}

type nodeOpt func(*Node)

func mkNode(name string, gpus []GPU, opts ...nodeOpt) Node {
	n := Node{Name: name, Alive: true, GPUs: gpus}
	for _, o := range opts {
		o(&n)
	}
	return n
}

func dead(n *Node) { n.Alive = false }

func withLabels(kv ...string) nodeOpt {
	return func(n *Node) {
		n.Labels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			n.Labels[kv[i]] = kv[i+1]
		}
	}
}

func holding(s ...HeldShard) nodeOpt {
	return func(n *Node) { n.Shards = append(n.Shards, s...) }
}

func caching(models ...string) nodeOpt {
	return func(n *Node) { n.CachedModels = models }
}

func hold(id, version string, lease LeaseState, stamp int64, gpus ...int) HeldShard {
	return HeldShard{ShardID: id, SpecVersion: version, GPUs: gpus, Lease: lease, ClaimStamp: stamp}
}

func mkDep(name string, opts ...func(*Deployment)) Deployment {
	d := Deployment{Name: name, Model: "org/" + name, Replicas: 1}
	for _, o := range opts {
		o(&d)
	}
	return d
}

func replicas(n int) func(*Deployment) { return func(d *Deployment) { d.Replicas = n } }
func tp(n int) func(*Deployment)       { return func(d *Deployment) { d.TensorParallel = n } }
func pp(n int) func(*Deployment)       { return func(d *Deployment) { d.PipelineParallel = n } }
func memGiB(n uint64) func(*Deployment) {
	return func(d *Deployment) { d.GPUMemory = Bytes(n * gib) }
}
func gpuType(t string) func(*Deployment) { return func(d *Deployment) { d.GPUType = t } }
func labels(kv ...string) func(*Deployment) {
	return func(d *Deployment) {
		d.Labels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Labels[kv[i]] = kv[i+1]
		}
	}
}
func args(a ...string) func(*Deployment) { return func(d *Deployment) { d.Args = a } }

func version(d Deployment) string { return d.SpecVersion() }

// find returns the plan's current assignments of a shard.
func find(p Plan, shard string) []Assignment {
	var out []Assignment
	for _, a := range p.Assignments {
		if a.ShardID == shard {
			out = append(out, a)
		}
	}
	return out
}

func unplaced(p Plan, shard string) (Unplaced, bool) {
	for _, u := range p.Unplaced {
		if u.ShardID == shard {
			return u, true
		}
	}
	return Unplaced{}, false
}

func mustJSON(t tb, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// heldFromPlan turns a plan into the shards nodes would report once they
// ran it, every lease judged lease, so tests can take a step in time.
func heldFromPlan(v View, p Plan, lease LeaseState) View {
	out := View{Deployments: v.Deployments, Nodes: make([]Node, len(v.Nodes))}
	at := map[string]int{}
	for i, n := range v.Nodes {
		n.Shards = nil
		out.Nodes[i] = n
		at[n.Name] = i
	}
	for i, a := range p.Assignments {
		n := &out.Nodes[at[a.Node]]
		n.Shards = append(n.Shards, HeldShard{
			ShardID: a.ShardID, SpecVersion: a.SpecVersion, GPUs: a.GPUs,
			MemoryPerGPU: a.MemoryPerGPU, Lease: lease, ClaimStamp: int64(i + 1),
		})
	}
	return out
}
