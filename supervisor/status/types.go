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
	GatewayTLS   bool                 `json:"gateway_tls,omitempty"`
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
