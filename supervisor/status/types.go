package status

import (
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/placement"
)

// MemberInfo is one node in /v1/cluster.
type MemberInfo struct {
	Name       string             `json:"name"`
	State      gossip.MemberState `json:"state"`
	Gossip     string             `json:"gossip"`
	API        string             `json:"api"`
	Gateway    string             `json:"gateway,omitempty"`
	GatewayTLS bool               `json:"gateway_tls,omitempty"`
	// GatewayRates is the requests/s the member's gateway sent to each
	// deployment lately (gossip.NodeRecord.GatewayRates); nil when its
	// record does not say.
	GatewayRates map[string]float64 `json:"gateway_rates,omitempty"`
	// GatewayQueued is the requests its gateway's queue holds for each
	// deployment now (gossip.NodeRecord.GatewayQueued).
	GatewayQueued map[string]int       `json:"gateway_queued,omitempty"`
	Labels        map[string]string    `json:"labels,omitempty"`
	GPUs          []placement.GPU      `json:"gpus"`
	Shards        []gossip.ShardRecord `json:"shards,omitempty"`
	Version       gossip.Version       `json:"version"`
	LastChange    time.Time            `json:"last_change,omitzero"`
	SeenAt        time.Time            `json:"seen_at,omitzero"`
	StartedAt     time.Time            `json:"started_at,omitzero"`
	AgentVersion  string               `json:"agent_version,omitempty"`
	Runtime       string               `json:"runtime,omitempty"`
	Probes        gossip.ProbeSummary  `json:"probes,omitzero"`
	Telemetry     gossip.Telemetry     `json:"telemetry,omitzero"`
	// ClockOffset is the node's clock minus the cluster's, as the
	// answering node estimates it (absent until it probed the node).
	ClockOffset *time.Duration `json:"clock_offset_ns,omitempty"`
	// TokenMismatch: the node announces another cluster token; it and the
	// answering node refuse each other's API calls.
	TokenMismatch bool `json:"token_mismatch,omitempty"`
	// Isolated (the answering node's own row only): it has heard no peer
	// since IsolatedSince although it expects some. Its leases lapse
	// elsewhere within the TTL; what it shows of others is old.
	Isolated      bool      `json:"isolated,omitempty"`
	IsolatedSince time.Time `json:"isolated_since,omitzero"`
	// CachedModels are the models in the node's weights dir.
	CachedModels []gossip.CachedModel `json:"cached_models,omitempty"`
	// Protocol is the range of protocol versions the node's build speaks,
	// as its memberlist meta announces it ([1, 1] for an agent from before
	// cluster versions; absent when the answering node has not met it). A
	// node whose range cannot speak the active version has State
	// "refused".
	Protocol protocol.Range `json:"protocol,omitzero"`
}

// ClusterInfo is the body of /v1/cluster.
type ClusterInfo struct {
	Self    string       `json:"self"`
	Members []MemberInfo `json:"members"`
	// ActiveVersion is the cluster protocol version the answering node
	// runs at; VersionsMixedSince since when live members announce
	// different versions (absent: they do not).
	ActiveVersion      int       `json:"active_version,omitempty"`
	VersionsMixedSince time.Time `json:"versions_mixed_since,omitzero"`
}

// DeploymentInfo is one deployment in /v1/deployments.
type DeploymentInfo struct {
	placement.Deployment
	SpecVersion string       `json:"spec_version"`
	Stamp       gossip.Stamp `json:"stamp"`
	Placed      int          `json:"placed"`
	Ready       int          `json:"ready"`
	Nodes       []string     `json:"nodes"`
	Why         []string     `json:"why,omitempty"`
	// Change is set only in the answer to a place: what the write did to
	// the spec the cluster held (ChangeNew, ChangeChanged, ChangeScaled,
	// ChangeSettings, ChangeUnchanged).
	Change string `json:"change,omitempty"`
	// Scale is an autoscaled deployment's target (nil: a fixed count);
	// Replicas is then the target in force.
	Scale *ScaleInfo `json:"scale,omitempty"`
	// AdapterStatus is, per LoRA adapter of the spec (in its order),
	// where it is registered and what failed elsewhere.
	AdapterStatus []AdapterInfo `json:"adapter_status,omitempty"`
	// Roles are a disaggregated deployment's prefill and decode replicas:
	// asked for, placed and ready (when the snapshot was built).
	Roles []RoleStatus `json:"roles,omitempty"`
	// PDOutcomes are, for a disaggregated deployment, the latest reason
	// the answering node's gateway saw for each outcome other than
	// disaggregated (fallback, skipped, no_params, version_mismatch,
	// failed): disaggregation never stops unseen.
	PDOutcomes map[string]string `json:"pd_outcomes,omitempty"`
}

// AdapterInfo is one LoRA adapter of a deployment across its replicas.
type AdapterInfo struct {
	Name   string `json:"name"`
	Source string `json:"source"`
	// Replicas are the ready replicas whose engine lists it, by ID.
	Replicas []string `json:"replicas"`
	// Errors are the registrations that failed, "replica: why", each
	// retried with a backoff.
	Errors []string `json:"errors,omitempty"`
	// Shadowed, when set, says why a request naming it goes elsewhere: a
	// deployment of that name, or an adapter of that name on a
	// deployment whose name sorts first.
	Shadowed string `json:"shadowed,omitempty"`
}

// ScaleInfo is the target in force of an autoscaled deployment: who
// decided it, when and why (empty decider: none yet, the spec's replicas
// stand).
type ScaleInfo struct {
	Target    int       `json:"target"`
	Decider   string    `json:"decider,omitempty"`
	DecidedAt time.Time `json:"decided_at,omitzero"`
	Reason    string    `json:"reason,omitempty"`
	// LastColdStart is how long the deployment's last wake from zero
	// took, from the decider's wake to a ready replica (zero: none seen).
	LastColdStart time.Duration `json:"last_cold_start_ns,omitempty"`
	// LastColdStartPull and LastColdStartLoad are its parts on the ready
	// replica's node: the image's pull, and the engine's load and
	// warm-up (process start to first ready answer). The rest is
	// deciding, placing and gossip.
	LastColdStartPull time.Duration `json:"last_cold_start_pull_ns,omitempty"`
	LastColdStartLoad time.Duration `json:"last_cold_start_load_ns,omitempty"`
	// Idle: its decider saw no request for its yield window, so its
	// replicas above its min may give their GPUs to a deployment with
	// demand (GPU sharing); LastRequest is the minute of its last request
	// as the decider saw it, published while idle (zero: none seen).
	Idle        bool      `json:"idle,omitempty"`
	LastRequest time.Time `json:"last_request,omitzero"`
}

// LeaseNone is the lease of a shard that nobody holds: planned on a node
// that has not claimed it yet (status pending), or placed nowhere (status
// unplaced).
//
// A shard's lease reads one of four words wherever it is shown (the page,
// `llmgw shards`, `llmgw top`, MCP, /metrics), all from ShardInfo.Lease:
//
//	valid     its holder is alive and renewing, and the engine is ready: routable
//	starting  its holder is alive and renewing; the engine is not ready yet
//	lapsed    a holder claimed it, but the claim no longer counts: the holder
//	          died, left, restarted or stopped renewing, or is stopping it
//	none      nobody holds it
//
// The first three are placement's judgements (placement.LeaseState).
const LeaseNone placement.LeaseState = "none"

// What a place did to the spec the cluster held under its name.
const (
	// ChangeNew: no live deployment had the name.
	ChangeNew = "new"
	// ChangeChanged: a new spec version; its replicas roll, the old
	// serving until the new are ready.
	ChangeChanged = "changed"
	// ChangeScaled: the same spec version with another replica count;
	// replicas that serve keep serving.
	ChangeScaled = "scaled"
	// ChangeSettings: the same spec version and replicas, another value
	// of a field that restarts no engine (update, start_timeout, autoscale): stored,
	// and no replica rolls.
	ChangeSettings = "settings"
	// ChangeUnchanged: the same spec and replicas.
	ChangeUnchanged = "unchanged"
)

// ShardInfo is one row of /v1/shards.
type ShardInfo struct {
	ShardID    string `json:"shard_id"`
	ReplicaID  string `json:"replica_id"`
	Deployment string `json:"deployment"`
	// Role is prefill or decode for a replica of a disaggregated
	// deployment, empty otherwise; KVPort its engine's KV transfer port.
	Role        string `json:"role,omitempty"`
	KVPort      int    `json:"kv_port,omitempty"`
	SpecVersion string `json:"spec_version"`
	Node        string `json:"node,omitempty"`
	GPUs        []int  `json:"gpus"`
	// Lease is valid, starting, lapsed or none (see LeaseNone).
	Lease placement.LeaseState `json:"lease"`
	// LeaseExpires is when the lease lapses unless its holder renews it,
	// as this node judges (zero once lapsed).
	LeaseExpires time.Time          `json:"lease_expires,omitzero"`
	Status       gossip.ShardStatus `json:"status"`
	Draining     bool               `json:"draining,omitempty"`
	URL          string             `json:"url,omitempty"`
	// Private: the engine listens on its holder's loopback only; other
	// nodes reach it through the holder's relay (gossip.ShardRecord).
	Private   bool             `json:"private,omitempty"`
	PID       int              `json:"pid,omitempty"`
	Container string           `json:"container,omitempty"`
	Restarts  int              `json:"restarts"`
	LastExit  *int             `json:"last_exit,omitempty"`
	StartedAt time.Time        `json:"started_at,omitzero"`
	Load      gossip.ShardLoad `json:"load,omitzero"`
	Reason    string           `json:"reason,omitempty"`
	// Note and NoteAt are what the holder says its engine is doing (see
	// gossip.ShardRecord.Note).
	Note   string    `json:"note,omitempty"`
	NoteAt time.Time `json:"note_at,omitzero"`
	// PullMs and LoadMs are how its engine's last start that became ready
	// spent its time (gossip.ShardRecord.PullMs, LoadMs).
	PullMs int64 `json:"pull_ms,omitempty"`
	LoadMs int64 `json:"load_ms,omitempty"`
	// Adapters and AdapterErrors are its engine's LoRA adapters as its
	// holder reports them (gossip.ShardRecord.Adapters, AdapterErrors).
	Adapters      []string              `json:"adapters,omitempty"`
	AdapterErrors []gossip.AdapterError `json:"adapter_errors,omitempty"`
	// Gang is the member's part of its gang (rank, size, generation, rank
	// 0's rendezvous, what holds it back) as its holder reports it; nil
	// for a replica of one shard.
	Gang *gossip.GangRecord `json:"gang,omitempty"`
}

// GatewayURL is where clients reach the member's gateway, scheme included:
// "http://10.0.0.5:8000", or https when it speaks TLS; empty when the
// member runs none.
func (m MemberInfo) GatewayURL() string {
	switch {
	case m.Gateway == "":
		return ""
	case m.GatewayTLS:
		return "https://" + m.Gateway
	}
	return "http://" + m.Gateway
}

// GatewayInfo is one gateway clients can send requests to: every gateway
// routes to every deployment's replicas, wherever they run.
type GatewayInfo struct {
	Node string `json:"node"`
	URL  string `json:"url"`
}

// Gateways lists the gateways of the alive members, in member order.
func Gateways(members []MemberInfo) []GatewayInfo {
	out := []GatewayInfo{}
	for _, m := range members {
		if u := m.GatewayURL(); u != "" && m.State == gossip.StateAlive {
			out = append(out, GatewayInfo{Node: m.Name, URL: u})
		}
	}
	return out
}

// RoleStatus is one role of a disaggregated deployment.
type RoleStatus struct {
	Role     string `json:"role"`
	Replicas int    `json:"replicas"`
	Placed   int    `json:"placed"`
	Ready    int    `json:"ready"`
}
