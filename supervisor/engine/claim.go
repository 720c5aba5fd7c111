package engine

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
)

// ClaimOnly claims every shard the plan gives this node and reports it
// ready at once, running nothing. It exercises the placement and lease
// protocol where no engines should run (`--runtime none`).
type ClaimOnly struct {
	clk     clock.Clock
	mu      sync.Mutex
	held    map[string]gossip.ShardRecord
	changes chan struct{}
}

// NewClaimOnly returns a runner that only claims, stamping its claims
// with clk.
func NewClaimOnly(clk clock.Clock) *ClaimOnly {
	return &ClaimOnly{clk: clk, held: map[string]gossip.ShardRecord{}, changes: make(chan struct{}, 1)}
}

func shardKey(shard, spec string) string { return shard + "@" + spec }

// Reconcile implements supervisor.Runner.
func (c *ClaimOnly) Reconcile(_ context.Context, desired []Desired) {
	c.mu.Lock()
	defer c.mu.Unlock()
	want := map[string]bool{}
	for _, d := range desired {
		k := shardKey(d.ShardID, d.SpecVersion)
		want[k] = true
		if _, ok := c.held[k]; ok {
			continue
		}
		now := c.clk.Now()
		c.held[k] = gossip.ShardRecord{
			ShardID: d.ShardID, ReplicaID: d.ReplicaID, Deployment: d.Deployment, SpecVersion: d.SpecVersion,
			GPUs: d.GPUs, MemoryPerGPU: d.MemoryPerGPU, Status: gossip.ShardReady, Ready: true,
			ClaimStamp: now.UnixNano(), StartedAt: now,
		}
	}
	for k := range c.held {
		if !want[k] {
			delete(c.held, k)
		}
	}
}

// Reclaim stamps every claim afresh (see Runner.Reclaim).
func (c *ClaimOnly) Reclaim(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, s := range c.held {
		s.ClaimStamp = now.UnixNano()
		c.held[k] = s
	}
}

// Shards implements supervisor.Runner.
func (c *ClaimOnly) Shards() []gossip.ShardRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]gossip.ShardRecord, 0, len(c.held))
	for _, s := range c.held {
		out = append(out, s)
	}
	SortShards(out)
	return out
}

// Changes implements supervisor.Runner.
func (c *ClaimOnly) Changes() <-chan struct{} { return c.changes }

// OwnPIDs implements supervisor.Runner.
func (c *ClaimOnly) OwnPIDs() []int { return nil }

// SortShards orders shard records by shard ID, then spec version.
func SortShards(s []gossip.ShardRecord) {
	sort.Slice(s, func(i, j int) bool {
		if s[i].ShardID != s[j].ShardID {
			return s[i].ShardID < s[j].ShardID
		}
		return s[i].SpecVersion < s[j].SpecVersion
	})
}
