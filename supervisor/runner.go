package supervisor

import (
	"context"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/supervisor/engine"
)

// Runner is what the node loop needs of whatever runs its shards: the
// engine runner (engine.Runner), or engine.ClaimOnly with --runtime none.
type Runner interface {
	// Reconcile makes the engines on this node match desired. It must not
	// block on engine start-up: readiness is reported through Shards and
	// Changes.
	Reconcile(ctx context.Context, desired []engine.Desired)
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

// settler is a Runner that waits to be told the node's view is whole
// before it starts or stops anything (see joiner.settle).
type settler interface{ Settle() }

// closer is a Runner that watches engines and stops watching on Close
// (the engines keep running).
type closer interface{ Close() }

// reclaimer is a Runner whose claims can be stamped afresh, after this
// node's leases lapsed (see leaseKeeper.reclaim).
type reclaimer interface{ Reclaim(now time.Time) }

// gpuCloser is a GPU probe that holds a library open (NVML).
type gpuCloser interface{ Close() error }

var (
	_ Runner    = (*engine.Runner)(nil)
	_ settler   = (*engine.Runner)(nil)
	_ closer    = (*engine.Runner)(nil)
	_ Runner    = (*engine.ClaimOnly)(nil)
	_ reclaimer = (*engine.Runner)(nil)
	_ reclaimer = (*engine.ClaimOnly)(nil)
)
