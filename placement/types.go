// Package placement decides which GPUs run which model shards.
//
// Compute is a pure function of a View: no I/O, no goroutines, no clock, no
// map-order or random dependence. Every node of a cluster runs it on its own
// copy of the cluster state and, for equal views, gets a byte-identical Plan.
// That is what lets llmgw work without a leader: nobody hands out
// assignments, everybody computes the same ones and acts only on its own
// part.
//
// The design sketched Plan(view, now). Time is not needed here: the only
// time-dependent input is whether a lease still holds, and that is judged by
// the view builder with the receiving node's own clock and arrives as
// HeldShard.Lease. Keeping the clock out makes the function easier to test
// and keeps "equal views, equal plans" literally true.
//
// The pipeline, in the style of Nomad's scheduler:
//
//	deployments ─► expand (replicas, shards, gangs)
//	held shards ─► keep what runs (valid or starting lease, current version)
//	            ─► drain old versions until their replacement is ready
//	nodes       ─► capacity index (nodes with equal state share a class)
//	gangs, largest first ─► feasibility (live, labels, GPU type, free GPUs)
//	                     ─► ranking (spread, pack, NVLink, cached weights)
//	                     ─► rendezvous-hash tie break
//	not placed  ─► a reason built from per-filter counts
//
// Scores are integers: floating point may be fused differently on amd64 and
// arm64, and a cluster of mixed machines must still agree.
//
// A test (deps_test.go) fails the build if this package imports anything that
// does I/O.
package placement

// GPU is one device of a node as the node advertises it.
type GPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
	// MemoryTotal is the device's memory in bytes.
	MemoryTotal uint64 `json:"memory_total_bytes"`
	// MemoryUsed is what the driver reports in use (NVML GetMemoryInfo_v2
	// Used, which excludes driver-reserved memory).
	MemoryUsed uint64 `json:"memory_used_bytes"`
	// MemoryForeign is the part of MemoryUsed held by processes llmgw does
	// not own. Placement fits against total minus foreign (rounded up to
	// whole GiB, so probe noise does not change plans) minus what llmgw's
	// own shards were promised: a GPU that someone else filled is not free
	// just because no shard of ours sits on it.
	MemoryForeign uint64 `json:"memory_foreign_bytes"`
	MIG           bool   `json:"mig,omitempty"`
	// NVLinkPeers are the indices of GPUs on the same node reachable by an
	// active NVLink.
	NVLinkPeers []int  `json:"nvlink_peers,omitempty"`
	PCIBusID    string `json:"pci_bus_id,omitempty"`
	// Faulted is set when the node saw recent driver faults (Xid) on this
	// GPU; placement puts nothing new on it.
	Faulted bool `json:"faulted,omitempty"`
}

// LeaseState is how the viewing node judges a held shard's lease.
type LeaseState string

const (
	// LeaseStarting: the holder claimed the shard and is alive and renewing,
	// but the engine is not ready yet. Placement keeps it where it is; it is
	// not routable.
	LeaseStarting LeaseState = "starting"
	// LeaseValid: ready, renewed within the TTL, holder alive. Routable.
	LeaseValid LeaseState = "valid"
	// LeaseLapsed: not renewed within the TTL, or the holder is dead or
	// left. The shard is free to re-place and must not be routed to.
	LeaseLapsed LeaseState = "lapsed"
)

// HeldShard is a shard a node says it runs, with the viewer's judgement of
// its lease.
type HeldShard struct {
	ShardID     string `json:"shard_id"`
	SpecVersion string `json:"spec_version"`
	GPUs        []int  `json:"gpus"`
	// MemoryPerGPU is what the shard was placed with (0: whole GPUs).
	MemoryPerGPU uint64     `json:"memory_per_gpu_bytes,omitempty"`
	Lease        LeaseState `json:"lease"`
	// ClaimStamp orders duplicate holders (after a partition heals, or a
	// holder returns): among copies that serve alike, the earliest claim
	// keeps the shard, then the lower node name. A holder whose leases
	// lapsed claims afresh when it returns.
	ClaimStamp int64 `json:"claim_stamp"`
	// Failing is set when the engine keeps crashing here; placement may then
	// move the shard to another node.
	Failing bool `json:"failing,omitempty"`
	// Settling marks a valid lease the viewing node first saw valid so
	// recently that other nodes may not have seen it yet (the gossip
	// spread). A copy this shard replaces keeps draining until it settles:
	// nodes see a replacement ready at different moments, and a holder
	// that stopped the old copy the moment it saw the new one ready would
	// leave the gateways that have not seen it yet with neither.
	Settling bool `json:"settling,omitempty"`
}

// Node is one member of the cluster as the viewing node sees it.
type Node struct {
	Name string `json:"name"`
	// Alive is memberlist's alive or suspect. Dead and left nodes are kept in
	// the view so their shards can be explained, but nothing is placed there.
	Alive  bool              `json:"alive"`
	Labels map[string]string `json:"labels,omitempty"`
	GPUs   []GPU             `json:"gpus"`
	Shards []HeldShard       `json:"shards,omitempty"`
	// CachedModels lists models whose weights are already on local disk.
	CachedModels []string `json:"cached_models,omitempty"`
}

// View is everything placement looks at.
type View struct {
	Nodes       []Node       `json:"nodes"`
	Deployments []Deployment `json:"deployments"`
	// Share turns GPU sharing by demand on (cluster protocol 6; see
	// share.go): idle replicas of autoscaled deployments above their min
	// give their GPUs to deployments with demand that do not fit.
	Share bool `json:"share,omitempty"`
	// Usage is how each autoscaled deployment's decider last saw it used,
	// by deployment name; read only with Share. A deployment without an
	// entry is not idle.
	Usage map[string]Usage `json:"usage,omitempty"`
}

// Usage is what GPU sharing reads of an autoscaled deployment's use, as
// its decider published it: quantised (a flag and a minute), so that
// every node's view agrees between two publications.
type Usage struct {
	// Idle: no request at any gateway and none running or waiting in
	// its engines for the decider's yield window.
	Idle bool `json:"idle,omitempty"`
	// LastRequest is the Unix minute of the last request the decider saw
	// (0: none seen); among idle deployments of one priority the least
	// recently used gives its GPUs up first.
	LastRequest int64 `json:"last_request_minute,omitempty"`
}

// Assignment places one shard of one spec version on one node's GPUs.
type Assignment struct {
	ShardID    string `json:"shard_id"`
	ReplicaID  string `json:"replica_id"`
	Deployment string `json:"deployment"`
	// Role is the replica's role in a disaggregated deployment
	// (RolePrefill or RoleDecode), "" in any other.
	Role        string `json:"role,omitempty"`
	SpecVersion string `json:"spec_version"`
	Node        string `json:"node"`
	GPUs        []int  `json:"gpus"`
	// MemoryPerGPU is the memory reserved on each GPU (0: whole GPUs).
	MemoryPerGPU uint64 `json:"memory_per_gpu_bytes,omitempty"`
	// Kept is true when the shard stays where a valid or starting lease
	// already holds it.
	Kept bool `json:"kept,omitempty"`
	// Draining marks a shard kept serving until what replaces it is ready
	// (surge, then drain): an older spec version, a copy on a GPU with
	// recent driver faults, or a replica scaled away.
	Draining bool `json:"draining,omitempty"`
}

// Unplaced is a shard placement could not put anywhere, and why.
type Unplaced struct {
	ShardID    string `json:"shard_id"`
	ReplicaID  string `json:"replica_id"`
	Deployment string `json:"deployment"`
	Reason     string `json:"reason"`
}

// Plan is placement's answer for a view. Both slices are sorted by shard ID
// (then spec version), so equal views marshal to equal bytes.
type Plan struct {
	Assignments []Assignment `json:"assignments"`
	Unplaced    []Unplaced   `json:"unplaced"`
}
