package supervisor

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// Desired is one shard the plan gives this node, with the spec it runs.
type Desired struct {
	placement.Assignment
	Spec placement.Deployment
}

// Engines is what the node loop needs of whatever runs shards here.
type Engines interface {
	// Reconcile makes the engines on this node match desired. It must not
	// block on engine start-up: readiness is reported through Shards and
	// Changes.
	Reconcile(ctx context.Context, desired []Desired)
	// Shards reports every shard held here, sorted by shard ID then spec
	// version.
	Shards() []gossip.ShardRecord
	// Changes is signalled when Shards changed on its own (an engine became
	// ready, crashed, restarted).
	Changes() <-chan struct{}
	// OwnPIDs are the host PIDs of engines we run, so their GPU memory is
	// not counted as foreign.
	OwnPIDs() []int
}

// ClaimEngines claims every shard the plan gives this node and reports it
// ready at once, running nothing. It exercises the placement and lease
// protocol where no engines should run (`--runtime none`).
type ClaimEngines struct {
	now     func() time.Time
	mu      sync.Mutex
	held    map[string]gossip.ShardRecord
	changes chan struct{}
}

// NewClaimEngines returns engines that only claim.
func NewClaimEngines(now func() time.Time) *ClaimEngines {
	return &ClaimEngines{now: now, held: map[string]gossip.ShardRecord{}, changes: make(chan struct{}, 1)}
}

func shardKey(shard, spec string) string { return shard + "@" + spec }

// Reconcile implements Engines.
func (c *ClaimEngines) Reconcile(_ context.Context, desired []Desired) {
	c.mu.Lock()
	defer c.mu.Unlock()
	want := map[string]bool{}
	for _, d := range desired {
		k := shardKey(d.ShardID, d.SpecVersion)
		want[k] = true
		if _, ok := c.held[k]; ok {
			continue
		}
		c.held[k] = gossip.ShardRecord{
			ShardID: d.ShardID, ReplicaID: d.ReplicaID, Deployment: d.Deployment, SpecVersion: d.SpecVersion,
			GPUs: d.GPUs, MemoryPerGPU: d.MemoryPerGPU, Status: StatusReady, Ready: true,
			ClaimStamp: c.now().UnixNano(), StartedAt: c.now(),
		}
	}
	for k := range c.held {
		if !want[k] {
			delete(c.held, k)
		}
	}
}

// Shards implements Engines.
func (c *ClaimEngines) Shards() []gossip.ShardRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]gossip.ShardRecord, 0, len(c.held))
	for _, s := range c.held {
		out = append(out, s)
	}
	SortShards(out)
	return out
}

// Changes implements Engines.
func (c *ClaimEngines) Changes() <-chan struct{} { return c.changes }

// OwnPIDs implements Engines.
func (c *ClaimEngines) OwnPIDs() []int { return nil }

// SortShards orders shard records by shard ID, then spec version.
func SortShards(s []gossip.ShardRecord) {
	sort.Slice(s, func(i, j int) bool {
		if s[i].ShardID != s[j].ShardID {
			return s[i].ShardID < s[j].ShardID
		}
		return s[i].SpecVersion < s[j].SpecVersion
	})
}
