package placement

import (
	"fmt"
	"testing"
)

// benchCluster builds a cluster of n 8-GPU nodes that looks like a real
// one: mostly H100 (NVSwitch), some A100 40GB, some L40S (PCIe only), four
// zones, a rack label nobody constrains, weights cached per rack, and the
// odd GPU with foreign memory, MIG or a recent fault.
func benchCluster(nodes int) []Node {
	out := make([]Node, nodes)
	for i := range out {
		var name string
		var mem uint64
		nvlink := true
		switch i % 10 {
		case 0, 1, 2, 3, 4, 5:
			name, mem = "NVIDIA H100 80GB HBM3", 80
		case 6, 7, 8:
			name, mem = "NVIDIA A100-SXM4-40GB", 40
		default:
			name, mem, nvlink = "NVIDIA L40S", 48, false
		}
		gs := hgpus(8, name, mem, nvlink)
		if i%97 == 0 {
			gs[0].MemoryForeign = 2 * gib
		}
		if i%211 == 0 {
			gs[0].MIG, gs[1].MIG = true, true
		}
		if i%307 == 0 {
			gs[3].Faulted = true
		}
		out[i] = Node{
			Name:         fmt.Sprintf("node-%05d", i),
			Alive:        true,
			Labels:       map[string]string{"zone": fmt.Sprintf("z%d", i%4), "rack": fmt.Sprintf("r%d", i/32)},
			GPUs:         gs,
			CachedModels: []string{fmt.Sprintf("org/model-%d", (i/32)%20)},
		}
	}
	return out
}

// benchDeployments asks for about shards shards, 25 per deployment, in a
// mix of shapes: multi-node whole-GPU pipelines, whole nodes, half nodes,
// memory-sized tensor-parallel and single-GPU shards, a GPU-type and a
// label constraint.
func benchDeployments(shards int) []Deployment {
	var out []Deployment
	for k := 0; k*25 < shards; k++ {
		d := Deployment{Name: fmt.Sprintf("dep-%04d", k), Model: fmt.Sprintf("org/model-%d", k%20), Replicas: 25}
		switch k % 8 {
		case 0:
			d.TensorParallel, d.PipelineParallel, d.Replicas, d.GPUType = 8, 2, 12, "H100"
		case 1:
			d.TensorParallel = 8
		case 2:
			d.TensorParallel = 4
		case 3:
			d.TensorParallel, d.GPUMemory = 2, 30*gib
		case 4:
			d.GPUMemory = 20 * gib
		case 5:
			d.GPUType = "L40S"
		case 6:
			d.TensorParallel, d.Labels = 2, map[string]string{"zone": "z1"}
		case 7:
			d.GPUMemory = 10 * gib
		}
		out = append(out, d)
	}
	return out
}

var benchSizes = []struct{ gpus, shards int }{
	{1000, 100},
	{10000, 1000},
	{100000, 10000},
}

func BenchmarkCompute(b *testing.B) {
	for _, size := range benchSizes {
		v := View{Nodes: benchCluster(size.gpus / 8), Deployments: benchDeployments(size.shards)}
		b.Run(fmt.Sprintf("gpus=%d/shards=%d", size.gpus, size.shards), func(b *testing.B) {
			var p Plan
			cpu := cpuTime()
			for b.Loop() {
				p = Compute(v)
			}
			reportCPU(b, cpu)
			b.ReportMetric(float64(len(p.Assignments)), "placed")
			b.ReportMetric(float64(len(p.Unplaced)), "unplaced")
		})
	}
}

// BenchmarkReplanNodeLost starts from the largest cluster's converged plan,
// held under valid leases, loses the node holding the most shards, and
// plans again: the everyday case of a failure.
func BenchmarkReplanNodeLost(b *testing.B) {
	size := benchSizes[len(benchSizes)-1]
	v := View{Nodes: benchCluster(size.gpus / 8), Deployments: benchDeployments(size.shards)}
	v = heldFromPlan(v, Compute(v), LeaseValid)
	lost := 0
	for i, n := range v.Nodes {
		if len(n.Shards) > len(v.Nodes[lost].Shards) {
			lost = i
		}
	}
	v.Nodes[lost].Alive = false
	for i := range v.Nodes[lost].Shards {
		v.Nodes[lost].Shards[i].Lease = LeaseLapsed
	}
	var p Plan
	cpu := cpuTime()
	for b.Loop() {
		p = Compute(v)
	}
	reportCPU(b, cpu)
	moved := 0
	for _, a := range p.Assignments {
		if !a.Kept {
			moved++
		}
	}
	b.ReportMetric(float64(len(v.Nodes[lost].Shards)), "lost")
	b.ReportMetric(float64(moved), "moved")
}

// BenchmarkComputeHard covers shapes of cluster the sized benchmarks do
// not: every node in a state of its own, demand beyond capacity (thousands
// of reasons to build), and many small deployments.
func BenchmarkComputeHard(b *testing.B) {
	const nodes, shards = 12500, 10000
	noisy := benchCluster(nodes)  // probe noise: under 1GiB, rounded away
	unique := benchCluster(nodes) // 0-2GiB foreign per GPU: few nodes alike
	for i := range noisy {
		digits := i
		for j := range noisy[i].GPUs {
			noisy[i].GPUs[j].MemoryForeign = uint64((i*8+j)%977+1) << 20
			unique[i].GPUs[j].MemoryForeign = uint64(digits%3) * gib
			digits /= 3
		}
	}
	over := benchDeployments(shards)
	for i := range over {
		over[i].Replicas *= 4
	}
	var many []Deployment
	for i := range 5000 {
		many = append(many, Deployment{
			Name: fmt.Sprintf("small-%05d", i), Model: fmt.Sprintf("org/model-%d", i%300), Replicas: 2,
			TensorParallel: 1 << (i % 3), GPUMemory: Bytes(uint64(10+i%7*5) * gib),
		})
	}
	for _, c := range []struct {
		name string
		v    View
	}{
		{"noisy-foreign", View{Nodes: noisy, Deployments: benchDeployments(shards)}},
		{"unique-nodes", View{Nodes: unique, Deployments: benchDeployments(shards)}},
		{"oversubscribed", View{Nodes: benchCluster(nodes), Deployments: over}},
		{"5000-deployments", View{Nodes: benchCluster(nodes), Deployments: many}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var p Plan
			cpu := cpuTime()
			for b.Loop() {
				p = Compute(c.v)
			}
			reportCPU(b, cpu)
			b.ReportMetric(float64(len(p.Assignments)), "placed")
			b.ReportMetric(float64(len(p.Unplaced)), "unplaced")
		})
	}
}

// reportCPU adds CPU milliseconds per operation (all threads, the garbage
// collector's included) since start.
func reportCPU(b *testing.B, start int64) {
	if used := cpuTime() - start; used > 0 && b.N > 0 {
		b.ReportMetric(float64(used)/1e6/float64(b.N), "cpu-ms/op")
	}
}
