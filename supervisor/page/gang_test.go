package page

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// The page shows a gang's members with their ranks, and which member holds
// the gang back.
func TestPageShowsGangRanks(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	spec := placement.Deployment{Name: "big", Model: "m", Engine: "fake", Replicas: 1, PipelineParallel: 2}.WithDefaults()
	v := spec.SpecVersion()
	rec := func(node, shard string, g gossip.GangRecord, ready bool, st gossip.ShardStatus) gossip.Member {
		return gossip.Member{Name: node, State: gossip.StateAlive, SeenAt: now, Record: &gossip.NodeRecord{Name: node,
			Shards: []gossip.ShardRecord{{ShardID: shard, ReplicaID: "big-0", Deployment: "big", SpecVersion: v, Status: st, Ready: ready, Gang: &g}}}}
	}
	members := []gossip.Member{
		rec("n1", "big-0-s0", gossip.GangRecord{Rank: 0, Size: 2, Generation: 5, Note: "rank 1 on n2 crashed; gang restarting"}, false, gossip.ShardBackoff),
		rec("n2", "big-0-s1", gossip.GangRecord{Rank: 1, Size: 2, Generation: 5, Note: "exited with code 1; waiting for rank 0's next generation"}, false, gossip.ShardCrashed),
	}
	plan := placement.Plan{Assignments: []placement.Assignment{
		{ShardID: "big-0-s0", ReplicaID: "big-0", Deployment: "big", SpecVersion: v, Node: "n1", GPUs: []int{0}},
		{ShardID: "big-0-s1", ReplicaID: "big-0", Deployment: "big", SpecVersion: v, Node: "n2", GPUs: []int{0}},
	}}
	view := placement.View{Deployments: []placement.Deployment{spec}, Nodes: []placement.Node{
		{Name: "n1", Alive: true, Shards: []placement.HeldShard{{ShardID: "big-0-s0", SpecVersion: v, Lease: placement.LeaseStarting}}},
		{Name: "n2", Alive: true, Shards: []placement.HeldShard{{ShardID: "big-0-s1", SpecVersion: v, Lease: placement.LeaseStarting}}},
	}}
	snap := status.Build(status.Input{Self: "n1", Now: now, TTL: 3 * time.Second, Plan: plan, View: view, Members: members,
		Deployments: []gossip.DeploymentRecord{{Name: "big", Spec: &spec}}})
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, build(snap, now, nil, false)); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, want := range []string{
		`big-0-s0 <span class="dim">rank 0/2</span>`, `big-0-s1 <span class="dim">rank 1/2</span>`,
		"rank 1 on n2: exited with code 1; waiting for rank 0&#39;s next generation",
		"rank 0 on n1: rank 1 on n2 crashed; gang restarting",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}
