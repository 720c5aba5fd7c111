package supervisor

import (
	"fmt"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// BenchmarkReconcilePlan is the planning part of one reconcile pass on a
// 500-node cluster of 8 H100s each with 200 deployments (one to four
// replicas of TP 1 to 8), every planned shard held ready under a valid
// lease: the view from the members' records (BuildView), the handover's
// marks, then either a plan computed (placement.Compute, what every pass
// did before) or the last plan kept because the view's plan inputs did not
// change (placement.SameInputs, what a pass woken by load, rates or
// telemetry does now).
//
//	go test -run '^$' -bench ReconcilePlan -benchtime 20x ./supervisor/
func BenchmarkReconcilePlan(b *testing.B) {
	const nodes, deployments = 500, 200
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	ttl := 3 * time.Second
	members := make([]gossip.Member, nodes)
	for i := range members {
		name := fmt.Sprintf("n%03d", i)
		rec := &gossip.NodeRecord{Name: name, API: fmt.Sprintf("10.0.%d.%d:7070", i/250, i%250+1)}
		for g := range 8 {
			rec.GPUs = append(rec.GPUs, placement.GPU{Index: g, UUID: fmt.Sprintf("GPU-%s-%d", name, g), Name: "NVIDIA H100 80GB HBM3",
				MemoryTotal: 80 << 30, NVLinkPeers: []int{(g + 1) % 8}})
		}
		members[i] = gossip.Member{Name: name, State: gossip.StateAlive, SeenAt: now, Record: rec}
	}
	var deps []gossip.DeploymentRecord
	for k := range deployments {
		d := placement.Deployment{Name: fmt.Sprintf("dep-%03d", k), Model: fmt.Sprintf("org/model-%d", k%20), Engine: "vllm",
			Replicas: 1 + k%4, TensorParallel: []int{1, 2, 4, 8}[k%4]}.WithDefaults()
		deps = append(deps, gossip.DeploymentRecord{Name: d.Name, Spec: &d, Stamp: gossip.Stamp{Wall: now.UnixMilli()}})
	}
	// Converge: every planned shard held, ready, on its planned node.
	plan := placement.Compute(BuildView(members, deps, now, ttl))
	byNode := map[string]int{}
	for i, m := range members {
		byNode[m.Name] = i
	}
	for _, a := range plan.Assignments {
		rec := members[byNode[a.Node]].Record
		rec.Shards = append(rec.Shards, gossip.ShardRecord{ShardID: a.ShardID, ReplicaID: a.ReplicaID, Deployment: a.Deployment,
			SpecVersion: a.SpecVersion, GPUs: a.GPUs, MemoryPerGPU: a.MemoryPerGPU, Status: gossip.ShardReady, Ready: true, ClaimStamp: 1})
	}
	var h handover
	for _, tc := range []struct {
		name string
		keep bool
	}{{"computed", false}, {"skipped", true}} {
		b.Run(tc.name, func(b *testing.B) {
			var pc planCache
			pc.plan(BuildView(members, deps, now, ttl))
			var p placement.Plan
			for b.Loop() {
				v := BuildView(members, deps, now, ttl)
				h.mark(&v, now, time.Second)
				if !tc.keep {
					pc.valid = false
				}
				p = pc.plan(v)
			}
			b.ReportMetric(float64(len(p.Assignments)), "assignments")
			b.ReportMetric(float64(len(p.Unplaced)), "unplaced")
		})
	}
}
