// Package protocol names the cluster protocol versions this build speaks.
//
// Every node computes the plan, judges leases and merges records by
// itself, so two builds whose rules differ must not both act on their own
// rules in one cluster. Each build speaks a range of protocol versions
// [Min, Max] and announces it in its memberlist meta. A node's active
// version (gossip.Cluster.ActiveVersion) is the highest version that
// every member speaks; it rises once no member that speaks less has been
// seen for a while, and it never goes down. Every rule that changes what
// another node computes (placement, leases, record formats, the spec
// fields a node accepts) is chosen by the active version, and the
// previous version's rule stays in the code until the next version
// retires it. See docs/architecture.md, "Cluster version".
package protocol

// The versions, one line each: what a version changed.
const (
	// V1 is every agent before cluster versions existed: it announces
	// no range in its meta, and reads as [1, 1].
	V1 = 1
	// V2: deployments may carry start_timeout; equal-stamp deployment
	// records are ordered longer encoded spec first (an older agent's
	// copy, stripped of a field it does not know, never wins); records
	// are relayed byte for byte; files in the data dir say which
	// protocol wrote them.
	V2 = 2
	// V3: an auto-sized deployment marks the concurrency llmgw chose
	// itself (fit.seqs_chosen), and vLLM and SGLang then get no
	// concurrency flag. The mark is part of the spec, so of its spec
	// version: a V2 agent, which drops it, would name the engine
	// differently; below V3 the chosen figure is stored unmarked and
	// passed to every engine as a cap. Also: SGLang gangs launch as one
	// pipeline stage per node (--tp-size TP --pp-size N) instead of one
	// tensor-parallel group over every GPU of the gang; every rank must
	// launch alike, so below V3 the old layout is kept.
	V3 = 3
	// V4: engines started from here on listen on their holder's loopback
	// only, and say so in their shard record (Private); other nodes'
	// gateways reach them through the holder's relay (a hop signed for
	// "relay", see supervisor/gateway/relay_server.go), never directly.
	// Below V4 an older gateway dials the engine URL of the record, so
	// engines keep listening on every address.
	V4 = 4
	// V5: autoscaled deployments. A spec may carry autoscale (replicas:
	// {min, max}); each such deployment's decider, chosen by rendezvous
	// among alive nodes, publishes its target in its own node record
	// (scale), and every node places the newest target for the
	// deployment's current spec instead of its replicas. A V4 node would
	// place the spec's replicas and relay the spec without autoscale, so
	// below V5 a place that sets it is refused.
	V5 = 5
	// V6: GPUs shared by demand. A deployment may carry priority, and
	// placement lets idle replicas of autoscaled deployments above their
	// min give their GPUs to a deployment with demand that does not fit
	// (placement/share.go), reading whether each is idle, and its last
	// request's minute, from its decider's target. Every node must
	// evict alike, so below V6 placement shares nothing and a place that
	// sets priority is refused. Also LoRA: a spec may carry max_loras,
	// max_lora_rank and adapters, registered on every replica at runtime,
	// and records say which each replica holds; a V5 node would run the
	// engines without LoRA and relay the spec without it.
	V6 = 6
	// V7: prefill/decode disaggregation. A spec may carry prefill,
	// decode and transfer (placement/roles.go): placement expands the
	// roles into replicas named <name>-p<i> and <name>-d<i>, engines
	// start with their role's KV transfer flags, shard records say the
	// role and its KV port, and gateways route each request as two legs.
	// A V6 node would place the spec as one plain replica and relay it
	// without its roles, so below V7 a place that sets them is refused.
	V7 = 7
)

// Min and Max bound the versions this build speaks. Min rises only when a
// release drops an old version's rules; a node whose Max is below a
// cluster's active version is refused by it.
const (
	Min = V1
	Max = V7
)

// Range is the span of versions one build speaks.
type Range struct {
	Min int `json:"min"`
	Max int `json:"max"`
}

// Build is this build's range.
func Build() Range { return Range{Min: Min, Max: Max} }

// Speaks reports whether a build of range r can run at version v.
func (r Range) Speaks(v int) bool { return r.Min <= v && v <= r.Max }

// Valid reports whether r is a range a peer may announce: 1 <= Min <= Max.
func (r Range) Valid() bool { return 1 <= r.Min && r.Min <= r.Max }
