package status

import (
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// MemberInfo is one node in /v1/cluster.
type MemberInfo struct {
	Name         string               `json:"name"`
	State        gossip.MemberState   `json:"state"`
	Gossip       string               `json:"gossip"`
	API          string               `json:"api"`
	Gateway      string               `json:"gateway,omitempty"`
	Labels       map[string]string    `json:"labels,omitempty"`
	GPUs         []placement.GPU      `json:"gpus"`
	Shards       []gossip.ShardRecord `json:"shards,omitempty"`
	Version      gossip.Version       `json:"version"`
	LastChange   time.Time            `json:"last_change,omitzero"`
	SeenAt       time.Time            `json:"seen_at,omitzero"`
	StartedAt    time.Time            `json:"started_at,omitzero"`
	AgentVersion string               `json:"agent_version,omitempty"`
	Runtime      string               `json:"runtime,omitempty"`
	Probes       gossip.ProbeSummary  `json:"probes,omitzero"`
	// ClockOffset is the node's clock minus the cluster's, as the
	// answering node estimates it (absent until it probed the node).
	ClockOffset *time.Duration `json:"clock_offset_ns,omitempty"`
	// TokenMismatch: the node announces another cluster token; it and the
	// answering node refuse each other's API calls.
	TokenMismatch bool `json:"token_mismatch,omitempty"`
}

// ClusterInfo is the body of /v1/cluster.
type ClusterInfo struct {
	Self    string       `json:"self"`
	Members []MemberInfo `json:"members"`
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
}

// ShardInfo is one row of /v1/shards.
type ShardInfo struct {
	ShardID     string               `json:"shard_id"`
	ReplicaID   string               `json:"replica_id"`
	Deployment  string               `json:"deployment"`
	SpecVersion string               `json:"spec_version"`
	Node        string               `json:"node,omitempty"`
	GPUs        []int                `json:"gpus"`
	Lease       placement.LeaseState `json:"lease"`
	// LeaseExpires is when the lease lapses unless its holder renews it,
	// as this node judges (zero once lapsed).
	LeaseExpires time.Time          `json:"lease_expires,omitzero"`
	Status       gossip.ShardStatus `json:"status"`
	Draining     bool               `json:"draining,omitempty"`
	URL          string             `json:"url,omitempty"`
	PID          int                `json:"pid,omitempty"`
	Container    string             `json:"container,omitempty"`
	Restarts     int                `json:"restarts"`
	LastExit     *int               `json:"last_exit,omitempty"`
	StartedAt    time.Time          `json:"started_at,omitzero"`
	Load         gossip.ShardLoad   `json:"load,omitzero"`
	Reason       string             `json:"reason,omitempty"`
}
