package page

import (
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// A deployment's load is the sum over its engines' readings (KV cache the
// mean), each shard's reading says how old it is, and the gateway's
// traffic is this node's own.
func TestDeploymentLoadTotalsAndReadingAge(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	spec := placement.Deployment{Name: "chat", Model: "m", Engine: "fake", Replicas: 2}.WithDefaults()
	ver := spec.SpecVersion()
	view := placement.View{Deployments: []placement.Deployment{spec}}
	var plan placement.Plan
	var members []gossip.Member
	for i, n := range []string{"n1", "n2"} {
		shard := "chat-" + string(rune('0'+i))
		load := gossip.ShardLoad{Running: float64(2 + i), Waiting: 1, KVCacheUsage: 0.2 + 0.2*float64(i), PromptTPS: 100, GenerationTPS: 40,
			RatesValid: true, ScrapedAt: now.Add(-time.Duration(4+10*i) * time.Second)}
		members = append(members, gossip.Member{Name: n, State: gossip.StateAlive, SeenAt: now,
			Record: &gossip.NodeRecord{Name: n, Shards: []gossip.ShardRecord{{ShardID: shard, ReplicaID: shard, Deployment: "chat", SpecVersion: ver,
				GPUs: []int{0}, Status: gossip.ShardReady, Ready: true, URL: "http://" + n + ":8100", Load: load}}}})
		view.Nodes = append(view.Nodes, placement.Node{Name: n, Alive: true,
			Shards: []placement.HeldShard{{ShardID: shard, SpecVersion: ver, Lease: placement.LeaseValid}}})
		plan.Assignments = append(plan.Assignments, placement.Assignment{ShardID: shard, ReplicaID: shard, Deployment: "chat", SpecVersion: ver, Node: n, GPUs: []int{0}})
	}
	snap := status.Build(status.Input{Self: "n1", Now: now, TTL: 10 * time.Second, Plan: plan, View: view, Members: members,
		Deployments: []gossip.DeploymentRecord{{Name: "chat", Spec: &spec}}})
	d := build(snap, now, []Traffic{{Deployment: "chat", Requests: 120, Rate: 2, Window: time.Minute, TTFBP50: 80 * time.Millisecond, TTFBP99: 1500 * time.Millisecond, Errors: 3}}, true)
	if len(d.Deployments) != 1 {
		t.Fatalf("deployments = %+v", d.Deployments)
	}
	dep := d.Deployments[0]
	if dep.Load != "5 run · 2 wait · KV 30% · 200 in / 80 out tok/s" {
		t.Errorf("load = %q", dep.Load)
	}
	if dep.Traffic != "2 req/s · TTFB p50 80 ms p99 1.5 s · 3 5xx" {
		t.Errorf("traffic = %q", dep.Traffic)
	}
	if !strings.Contains(d.TrafficNote, "last 1m through this node's gateway") {
		t.Errorf("traffic note = %q", d.TrafficNote)
	}
	if len(d.Shards) != 2 || d.Shards[0].LoadAge != "read 4s ago" || d.Shards[1].LoadAge != "read 14s ago" || d.Shards[1].URL != "http://n2:8100" {
		t.Errorf("shard rows = %+v", d.Shards)
	}
	if got := trafficText(Traffic{Requests: 7200, Rate: 120}); got != "120 req/s" {
		t.Errorf("120 req/s written %q", got)
	}
	// A node without a gateway says so instead of showing no requests.
	if d := build(snap, now, nil, false); d.Deployments[0].Traffic != "" || !strings.Contains(d.TrafficNote, "runs no gateway") {
		t.Errorf("without a gateway: traffic %q, note %q", d.Deployments[0].Traffic, d.TrafficNote)
	}
}

// An autoscaled deployment's row says its range and its decider's last
// word; at zero, that a request wakes it.
func TestAutoscaledDeploymentRow(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	spec := placement.Deployment{Name: "chat", Model: "m", Engine: "fake", Replicas: 1, Autoscale: &placement.Autoscale{Min: 0, Max: 3}}.WithDefaults()
	stamp := gossip.Stamp{Wall: now.UnixMilli(), Origin: "n1"}
	rows := func(target int, reason string) depRow {
		placed := spec
		placed.Replicas = target
		members := []gossip.Member{{Name: "n1", State: gossip.StateAlive, SeenAt: now, Record: &gossip.NodeRecord{Name: "n1",
			Scale: []gossip.ScaleTarget{{Deployment: "chat", Spec: stamp, Replicas: target, At: stamp, Reason: reason}}}}}
		snap := status.Build(status.Input{Self: "n1", Now: now, TTL: 10 * time.Second, View: placement.View{Deployments: []placement.Deployment{placed}},
			Members: members, Deployments: []gossip.DeploymentRecord{{Name: "chat", Spec: &spec, Stamp: stamp}}})
		return build(snap, now, nil, false).Deployments[0]
	}
	if r := rows(2, "scaling up: 12 in flight"); r.Wanted != 2 || r.Scale != "auto 0-3: scaling up: 12 in flight" {
		t.Errorf("at 2: wanted %d, scale %q", r.Wanted, r.Scale)
	}
	if r := rows(0, "scaled to zero: no request for 10m0s, wakes on request"); r.Wanted != 0 || r.Scale != "auto 0-3: scaled to zero, wakes on request" {
		t.Errorf("at 0: wanted %d, scale %q", r.Wanted, r.Scale)
	}
}
