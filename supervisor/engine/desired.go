package engine

import (
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// Desired is one shard the plan gives this node, with the spec it runs.
type Desired struct {
	placement.Assignment
	Spec placement.Deployment
	// Gang is set for a member of a replica that spans nodes: what this
	// node, in this pass, knows of the rest of its gang.
	Gang *Gang
	// ClusterVersion is the node's active cluster protocol version in the
	// pass that wants the shard. A start reads it: from
	// internal/protocol.V4 on, the engine listens on 127.0.0.1 only, and
	// other nodes reach it through this node's relay; below, an older
	// gateway dials it at the node's address, so it listens on every
	// address. 0 (tests that leave it out): below V4.
	ClusterVersion int
	// Failover is set when this node takes the shard over from another
	// node whose lease on it this node judged lapsed; nil otherwise. The
	// runner traces the takeover (Config.Tracer) from the lapse until its
	// engine is first ready.
	Failover *Failover
}

// Failover is a takeover as the node that takes the shard sees it.
type Failover struct {
	// From is the node that held the shard.
	From string
	// At is when this node's judgement of From's lease turned to lapsed,
	// by this node's clock, and Why what lapsed it (see supervisor's
	// failovers).
	At  time.Time
	Why string
}

// Gang is one member's view of its gang in one reconcile pass: where the
// plan puts every rank, and what each rank's planned holder reports, as
// this node judges it. The runner reads it to start, stop and judge the
// member; it is rebuilt at every pass.
type Gang struct {
	// Size is the deployment's pipeline_parallel and Rank this member's.
	Size, Rank int
	// Peers[j] is rank j as the plan places it (Peers[Rank] is this
	// member itself).
	Peers []GangPeer
	// LostNodes are the nodes this node judges lost (see GangPeer.Lost):
	// a rank the plan moved away from a lost node tears the gang down at
	// once, where a move alone waits (see gangMoveGrace).
	LostNodes []string
	// ClusterVersion is the node's active cluster protocol version in
	// this pass: every rank launches with the layout of that version
	// (profile.Inputs.ClusterVersion).
	ClusterVersion int
}

// GangPeer is one rank as its planned holder reports it.
type GangPeer struct {
	// Node is where the plan puts the rank ("" if it does not).
	Node string
	// Held: the node's record reports the shard at this spec version.
	Held bool
	// Lost: the holder is gone, not alive, leaving, or renewing no more
	// within the lease TTL. A record of an older boot, while the node's
	// agent restarts, is not lost: the new agent adopts the engine.
	Lost   bool
	Ready  bool
	Status gossip.ShardStatus
	// Gang is the rank's gang part of its record (zero if none).
	Gang gossip.GangRecord
}
