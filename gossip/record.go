package gossip

import (
	"slices"
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
	Running       float64 `json:"running"`
	Waiting       float64 `json:"waiting"`
	KVCacheUsage  float64 `json:"kv_cache_usage"`
	PromptTPS     float64 `json:"prompt_tokens_per_s"`
	GenerationTPS float64 `json:"generation_tokens_per_s"`
	RatesValid    bool    `json:"rates_valid"`
	// PrefixHitRate (0-1) is the share of prompt tokens the engine's prefix
	// cache held since the previous scrape, out of PrefixQueriesPS looked
	// up per second.
	PrefixHitRate   float64   `json:"prefix_cache_hit_rate,omitempty"`
	PrefixQueriesPS float64   `json:"prefix_cache_queries_per_s,omitempty"`
	ScrapedAt       time.Time `json:"scraped_at,omitzero"`
	Error           string    `json:"error,omitempty"`
	// Unknown names the readings the engine does not export (probes/load's
	// Unknown* names: "kv_cache_usage", ...): their figures above are 0
	// only because nothing was read, and readers show them unknown.
	Unknown []string `json:"unknown,omitempty"`
}

// ReadingKVCache names the KV cache usage in ShardLoad.Unknown (probes/
// load's UnknownKVCache).
const ReadingKVCache = "kv_cache_usage"

// Knows reports whether the reading what (a probes/load Unknown* name,
// such as "kv_cache_usage") was read.
func (l ShardLoad) Knows(what string) bool { return !slices.Contains(l.Unknown, what) }

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
	ShardID    string `json:"shard_id"`
	ReplicaID  string `json:"replica_id"`
	Deployment string `json:"deployment"`
	// Role is the replica's role in a disaggregated deployment (prefill
	// or decode; protocol 7), and KVPort the engine's KV transfer port
	// on its holder: an SGLang prefill's bootstrap port, which gateways
	// name to its decode (vLLM's prefill names its side channel itself).
	Role         string `json:"role,omitempty"`
	KVPort       int    `json:"kv_port,omitempty"`
	SpecVersion  string `json:"spec_version"`
	GPUs         []int  `json:"gpus"`
	MemoryPerGPU uint64 `json:"memory_per_gpu_bytes,omitempty"`
	// Status is the engine's state on its node.
	Status ShardStatus `json:"status"`
	// Ready is set only while the engine answers /health and lists its
	// model; a record renewal then renews the shard's lease.
	Ready      bool   `json:"ready"`
	ClaimStamp int64  `json:"claim_stamp"`
	Failing    bool   `json:"failing,omitempty"`
	URL        string `json:"url,omitempty"`
	// Private: the engine listens on its holder's loopback only (engines
	// started at cluster version 4 and above, internal/protocol.V4). URL
	// still names the holder and the port, but another node reaches the
	// engine only through the holder's relay (supervisor/gateway,
	// RelayPath). False: it listens on every address, and URL is dialled.
	Private   bool      `json:"private,omitempty"`
	PID       int       `json:"pid,omitempty"`
	Container string    `json:"container,omitempty"`
	Restarts  int       `json:"restarts,omitempty"`
	LastExit  *int      `json:"last_exit,omitempty"`
	StartedAt time.Time `json:"started_at,omitzero"`
	Load      ShardLoad `json:"load,omitzero"`
	// Error is why the last start failed (no such image, no engine
	// binary), until a start succeeds: without it a shard in backoff says
	// nothing about why.
	Error string `json:"error,omitempty"`
	// Note says what an engine that does not serve is doing, or why it
	// stopped serving: "pulling image 43%", "loading", "not routable: 3
	// probes in a row failed ...", "restarted: hung ...". NoteAt is the
	// moment it refers to (for "loading": when the engine's log or the
	// weights cache last grew), so a reader says "2s ago" by its own clock
	// and the record need not change every second.
	Note   string    `json:"note,omitempty"`
	NoteAt time.Time `json:"note_at,omitzero"`
	// PullMs and LoadMs are how the engine's last start on this node that
	// became ready spent its time: its image's pull, and from its
	// process's start to its first ready answer (the weights' load and
	// the engine's own warm-up, which it does before it answers ready).
	// Zero for an engine this agent adopted without seeing it start.
	PullMs int64 `json:"pull_ms,omitempty"`
	LoadMs int64 `json:"load_ms,omitempty"`
	// Adapters are the LoRA adapters the engine has registered, by its
	// own models list (protocol 6), sorted; AdapterErrors why the
	// registration of an adapter its deployment asks for failed (it is
	// retried with a backoff).
	Adapters      []string       `json:"adapters,omitempty"`
	AdapterErrors []AdapterError `json:"adapter_errors,omitempty"`
	// Gang is set for a member of a replica that spans nodes
	// (pipeline_parallel above 1); see GangRecord.
	Gang *GangRecord `json:"gang,omitempty"`
}

// AdapterError is why a LoRA adapter is not registered on an engine.
type AdapterError struct {
	Name  string `json:"name"`
	Error string `json:"error"`
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
	// DriverFaultsRecent and DriverFaultsBoot count driver faults (Xid
	// lines and NVRM errors such as NV_ERR_*, not the driver's notices)
	// in the node's fault window and since boot; XidRecent the Xids among
	// the recent ones. LastDriverFault is the newest fault line (at most
	// MaxFaultLine bytes) and LastDriverFaultAt when the kernel logged it.
	DriverFaultsRecent int       `json:"driver_faults_recent,omitempty"`
	DriverFaultsBoot   int       `json:"driver_faults_boot,omitempty"`
	XidRecent          int       `json:"xid_recent,omitempty"`
	LastDriverFault    string    `json:"last_driver_fault,omitempty"`
	LastDriverFaultAt  time.Time `json:"last_driver_fault_at,omitzero"`
	GPUDriver          string    `json:"gpu_driver,omitempty"`
	GPUsSimulated      bool      `json:"gpus_simulated,omitempty"`
}

// MaxFaultLine bounds ProbeSummary.LastDriverFault.
const MaxFaultLine = 300

// Telemetry is what a node reads that changes at every sample: GPU
// activity and interconnect rates. It is for people, never for placement
// (BuildView does not read it), and a node publishes it rounded and at
// most as often as engine load, so records do not churn with it.
type Telemetry struct {
	GPUs  []GPUTelemetry `json:"gpus,omitempty"`
	Links []LinkRate     `json:"links,omitempty"`
	// ReadAt is when the node read it, by its own clock.
	ReadAt time.Time `json:"read_at,omitzero"`
}

// GPUTelemetry is one GPU's activity, rounded: utilisation to 5 %,
// temperature to 1 °C, power to 10 W. The No* flags mark readings the
// driver did not give (a board without a power sensor is not at 0 W).
type GPUTelemetry struct {
	Index   int  `json:"index"`
	UtilPct int  `json:"util_pct"`
	TempC   int  `json:"temp_c"`
	PowerW  int  `json:"power_w"`
	NoUtil  bool `json:"no_util,omitempty"`
	NoTemp  bool `json:"no_temp,omitempty"`
	NoPower bool `json:"no_power,omitempty"`
}

// LinkRate is one RDMA port's traffic in MB/s (10^6 bytes), rounded to
// 0.1 MB/s; Up is false for a port without a link.
type LinkRate struct {
	Device string  `json:"device"`
	Port   int     `json:"port"`
	Up     bool    `json:"up"`
	TxMBps float64 `json:"tx_mb_s"`
	RxMBps float64 `json:"rx_mb_s"`
}

// CachedModel is one model in the node's weights directory (probes/weights
// scans it), with its size on disk. Placement prefers nodes that have a
// deployment's model.
type CachedModel struct {
	Model string `json:"model"`
	Bytes uint64 `json:"bytes,omitempty"`
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
	Gateway    string `json:"gateway,omitempty"`
	GatewayTLS bool   `json:"gateway_tls,omitempty"`
	// GatewayRates is the requests per second the node's gateway sent to
	// each deployment lately (see gateway.Gateway.Rates), published when
	// one moves by a quarter: the other gateways weigh by it how much of a
	// replica's unseen load may be this one's. A node with a gateway
	// always sends it, empty when idle; nil means an agent too old to say.
	GatewayRates map[string]float64 `json:"gateway_rates"`
	// GatewayQueued is how many requests the node's gateway holds in its
	// queue for each deployment (every routable replica is at its bound
	// by the gateway's estimate): demand that no engine's load shows yet,
	// which deciders add to it. Absent when no queue holds any.
	GatewayQueued map[string]int    `json:"gateway_queued,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	GPUs          []placement.GPU   `json:"gpus"`
	Shards        []ShardRecord     `json:"shards,omitempty"`
	CachedModels  []CachedModel     `json:"cached_models,omitempty"`
	Probes        ProbeSummary      `json:"probes,omitzero"`
	Telemetry     Telemetry         `json:"telemetry,omitzero"`
	AgentVersion  string            `json:"agent_version"`
	StartedAt     time.Time         `json:"started_at"`
	Runtime       string            `json:"runtime,omitempty"`
	// Leaving is the node's last word before a graceful leave. memberlist's
	// leave event does not say whether a node left or died (the Node it
	// passes carries a stale State), so the record says it.
	Leaving bool `json:"leaving,omitempty"`
	// Scale are the replica targets this node decided for the autoscaled
	// deployments it is the decider of (protocol 5; see ScaleTargetFor).
	Scale []ScaleTarget `json:"scale,omitempty"`
}

// ScaleTarget is an autoscaled deployment's replica count as its decider
// chose it, for the deployment record of stamp Spec: a target for an
// older spec (placed again since) counts for nothing.
type ScaleTarget struct {
	Deployment string `json:"deployment"`
	Spec       Stamp  `json:"spec"`
	Replicas   int    `json:"replicas"`
	// At orders targets of one spec: the newest counts, whoever wrote it
	// (two nodes that each believe they decide, briefly, agree by it).
	At Stamp `json:"at"`
	// Reason is the rule's word for the target, shown by llmgw models.
	Reason string `json:"reason,omitempty"`
	// ColdStartMs is how long the deployment's last wake from zero took,
	// the decider's wake to a ready replica, in milliseconds (0: none).
	ColdStartMs int64 `json:"cold_start_ms,omitempty"`
	// ColdStartPullMs and ColdStartLoadMs are the parts of it the ready
	// replica's holder reported (ShardRecord.PullMs, LoadMs); the rest
	// is deciding, placing and gossip.
	ColdStartPullMs int64 `json:"cold_start_pull_ms,omitempty"`
	ColdStartLoadMs int64 `json:"cold_start_load_ms,omitempty"`
	// Idle and LastRequest are the deployment's use as its decider saw it
	// (protocol 6): no request anywhere for its yield window, and the
	// Unix minute of its last request (0: none seen). Placement's GPU
	// sharing reads them (placement.Usage); a minute, not a time, so that
	// the record changes at most once a minute for them.
	Idle        bool  `json:"idle,omitempty"`
	LastRequest int64 `json:"last_request_minute,omitempty"`
}

// ScaleTargetFor is the target in force for the autoscaled deployment d:
// of the targets for d's current spec in any member's record, the newest
// by At; false when there is none (the spec's replicas stand). Every node
// that holds the same records chooses the same one.
func ScaleTargetFor(members []Member, d DeploymentRecord) (ScaleTarget, bool) {
	var best ScaleTarget
	found := false
	for _, m := range members {
		if m.Record == nil {
			continue
		}
		for _, t := range m.Record.Scale {
			if t.Deployment == d.Name && t.Spec == d.Stamp && (!found || best.At.Less(t.At)) {
				best, found = t, true
			}
		}
	}
	return best, found
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
