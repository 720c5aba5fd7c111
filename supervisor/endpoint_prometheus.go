package supervisor

import (
	"cmp"
	"net/http"
	"slices"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// promTargets is one group of Prometheus's http_sd_config format: the
// addresses to scrape and the labels every series of theirs gets.
type promTargets struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// EngineMetricsPrefix is the path through which a holder serves an
// engine's metrics (supervisor/gateway.MetricsPattern, registered by
// cmd/llmgw with the relay; a test there keeps the two equal, since this
// package may not import the gateway).
const EngineMetricsPrefix = "/v1/engines/"

// handlePrometheusTargets is /v1/prometheus/targets: every alive node's
// /metrics and every started engine's metrics, in Prometheus's HTTP
// service discovery format, so one scrape config on any node's address
// follows the cluster as it changes. Engines are scraped through their
// holder's API (their own port is on its loopback, and llama.cpp wants
// its key on /metrics, which Prometheus cannot send per target). Labels:
// node on every target; deployment, shard and engine (the kind: vllm,
// sglang, llamacpp, fake) on an engine's. An engine series that carries an
// engine label of its own keeps it as exported_engine (Prometheus's rule
// for a clash with a target label).
func (s *apiServer) handlePrometheusTargets(w http.ResponseWriter, r *http.Request) {
	kinds := map[string]string{}
	for _, d := range s.gossip.Deployments() {
		if d.Spec != nil && !d.Deleted {
			kinds[d.Name] = d.Spec.WithDefaults().Engine
		}
	}
	out := []promTargets{}
	for _, m := range s.gossip.Members() {
		if m.State != gossip.StateAlive || m.Record == nil || m.Record.API == "" {
			continue
		}
		rec := m.Record
		out = append(out, promTargets{Targets: []string{rec.API}, Labels: map[string]string{"node": rec.Name, "__metrics_path__": "/metrics"}})
		for _, sh := range rec.Shards {
			// A gang's other ranks serve no HTTP: rank 0 is the engine.
			if sh.URL == "" || (sh.Gang != nil && sh.Gang.Rank != 0) {
				continue
			}
			out = append(out, promTargets{Targets: []string{rec.API}, Labels: map[string]string{
				"node": rec.Name, "deployment": sh.Deployment, "shard": sh.ShardID, "engine": kinds[sh.Deployment],
				"__metrics_path__": EngineMetricsPrefix + placement.EngineID(sh.ShardID, sh.SpecVersion) + "/metrics",
			}})
		}
	}
	slices.SortFunc(out, func(a, b promTargets) int {
		return cmp.Or(cmp.Compare(a.Labels["node"], b.Labels["node"]), cmp.Compare(a.Labels["__metrics_path__"], b.Labels["__metrics_path__"]))
	})
	writeJSON(w, http.StatusOK, out)
}
