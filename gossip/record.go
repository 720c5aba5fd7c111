package gossip

import (
	"time"

	"github.com/llmgw/llmgw/placement"
)

// Version orders a node's records: a restart bumps Epoch, every change or
// renewal bumps Seq. Only the owning node writes its record, so "newer wins"
// is the whole merge rule.
type Version struct {
	Epoch int64  `json:"epoch"`
	Seq   uint64 `json:"seq"`
}

// Newer reports whether v is strictly newer than o.
func (v Version) Newer(o Version) bool {
	if v.Epoch != o.Epoch {
		return v.Epoch > o.Epoch
	}
	return v.Seq > o.Seq
}

// ShardLoad is an engine's load as last scraped by its node.
type ShardLoad struct {
	Running       float64   `json:"running"`
	Waiting       float64   `json:"waiting"`
	KVCacheUsage  float64   `json:"kv_cache_usage"`
	PromptTPS     float64   `json:"prompt_tokens_per_s"`
	GenerationTPS float64   `json:"generation_tokens_per_s"`
	RatesValid    bool      `json:"rates_valid"`
	ScrapedAt     time.Time `json:"scraped_at,omitzero"`
	Error         string    `json:"error,omitempty"`
}

// ShardStatus is what a shard's engine is doing on its holder.
type ShardStatus string

// The statuses a holder reports in its record.
const (
	ShardStarting ShardStatus = "starting"
	ShardReady    ShardStatus = "ready"
	ShardCrashed  ShardStatus = "crashed"
	ShardBackoff  ShardStatus = "backoff"
	ShardStopping ShardStatus = "stopping"
)

// The statuses the read model gives shards that no holder reports. They
// never travel in a record.
const (
	// ShardPending: planned on a node that does not hold it yet.
	ShardPending ShardStatus = "pending"
	// ShardUnplaced: placement found no room for it.
	ShardUnplaced ShardStatus = "unplaced"
)

// ShardRecord is one shard a node holds, as that node reports it.
type ShardRecord struct {
	ShardID      string `json:"shard_id"`
	ReplicaID    string `json:"replica_id"`
	Deployment   string `json:"deployment"`
	SpecVersion  string `json:"spec_version"`
	GPUs         []int  `json:"gpus"`
	MemoryPerGPU uint64 `json:"memory_per_gpu_bytes,omitempty"`
	// Status is the engine's state on its node.
	Status ShardStatus `json:"status"`
	// Ready is set only while the engine answers /health and lists its
	// model; a record renewal then renews the shard's lease.
	Ready      bool      `json:"ready"`
	ClaimStamp int64     `json:"claim_stamp"`
	Failing    bool      `json:"failing,omitempty"`
	URL        string    `json:"url,omitempty"`
	PID        int       `json:"pid,omitempty"`
	Container  string    `json:"container,omitempty"`
	Restarts   int       `json:"restarts,omitempty"`
	LastExit   *int      `json:"last_exit,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	Load       ShardLoad `json:"load,omitzero"`
	// Error is why the last start failed (no such image, no engine
	// binary), until a start succeeds: without it a shard in backoff says
	// nothing about why.
	Error string `json:"error,omitempty"`
	// Gang is set for a member of a replica that spans nodes
	// (pipeline_parallel above 1); see GangRecord.
	Gang *GangRecord `json:"gang,omitempty"`
}

// GangRecord is one member's part of its gang, as its holder reports it.
// There is no leader: rank 0's holder picks the rendezvous port and
// publishes it here with a generation; the other members start their
// engines once they see it, and stop theirs when it changes.
type GangRecord struct {
	// Rank is the member's shard index and Size the gang's
	// pipeline_parallel.
	Rank int `json:"rank"`
	Size int `json:"size"`
	// Generation, in rank 0's record, is the gang's current start (Unix
	// ns when rank 0 started it; every restart of the gang takes a larger
	// one, so no member dials a stale rendezvous); 0 until it started. In
	// another member's record it is the generation its engine runs
	// against, 0 while it waits.
	Generation int64 `json:"generation,omitempty"`
	// Addr is rank 0's rendezvous, host:port at its holder's advertised
	// host (rank 0 only).
	Addr string `json:"addr,omitempty"`
	// Members, in rank 0's record, is the node of every rank in this
	// generation; a member starts only where it is named.
	Members []string `json:"members,omitempty"`
	// Note says what holds this member, or the gang, back ("waiting for
	// rank 0's address", "rank 1 on n3 crashed; gang restarting").
	Note string `json:"note,omitempty"`
}

// ProbeSummary is what the node's probes found worth telling the cluster.
type ProbeSummary struct {
	DriverFaultsRecent int    `json:"driver_faults_recent,omitempty"`
	DriverFaultsBoot   int    `json:"driver_faults_boot,omitempty"`
	LastDriverFault    string `json:"last_driver_fault,omitempty"`
	GPUDriver          string `json:"gpu_driver,omitempty"`
	GPUsSimulated      bool   `json:"gpus_simulated,omitempty"`
}

// NodeRecord is everything a node tells the cluster about itself. It has a
// single writer, its node.
type NodeRecord struct {
	Name    string  `json:"name"`
	Version Version `json:"version"`
	// Content is the version at which the content last changed. Beats
	// advance Version alone, so a record relayed by push/pull can carry a
	// Version newer than its content; receivers match beats against Content.
	Content Version `json:"content"`
	API     string  `json:"api"`
	Gossip  string  `json:"gossip"`
	// Gateway is where the node's OpenAI-compatible gateway answers
	// (host:port; empty: none), and GatewayTLS whether it speaks HTTPS
	// there. GatewayTLS is refused without a Gateway.
	Gateway      string            `json:"gateway,omitempty"`
	GatewayTLS   bool              `json:"gateway_tls,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	GPUs         []placement.GPU   `json:"gpus"`
	Shards       []ShardRecord     `json:"shards,omitempty"`
	CachedModels []string          `json:"cached_models,omitempty"`
	Probes       ProbeSummary      `json:"probes,omitzero"`
	AgentVersion string            `json:"agent_version"`
	StartedAt    time.Time         `json:"started_at"`
	Runtime      string            `json:"runtime,omitempty"`
	// Leaving is the node's last word before a graceful leave. memberlist's
	// leave event does not say whether a node left or died (the Node it
	// passes carries a stale State), so the record says it.
	Leaving bool `json:"leaving,omitempty"`
}

// DeploymentRecord is one deployment's replicated state: the spec, or a
// tombstone once deleted. Any node may write it; the later stamp wins.
type DeploymentRecord struct {
	Name    string                `json:"name"`
	Spec    *placement.Deployment `json:"spec,omitempty"`
	Deleted bool                  `json:"deleted,omitempty"`
	Stamp   Stamp                 `json:"stamp"`
}

// Beat renews a node's record without resending it: "my record is now at
// Version, and its content is the one of version Content". A receiver that
// holds that content takes the new version (and with it, renewed leases);
// one that does not waits for the full record, which push/pull repairs.
type Beat struct {
	Name    string  `json:"name"`
	Version Version `json:"version"`
	Content Version `json:"content"`
}
