package supervisor

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
)

// A node answers Prometheus's HTTP service discovery for the cluster:
// each node's /metrics, and each started engine through its holder,
// labelled with node, deployment, shard and engine.
func TestPrometheusTargetsListEveryNodeAndEngine(t *testing.T) {
	h := newHarness(t)
	cfg := h.config("a")
	cfg.Runner = processRunner(t, t.TempDir())
	n, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Kill() })
	call(t, "POST", api(n, "/v1/deployments"), testToken, []byte(`{"name":"chat","model":"m","engine":"fake"}`), nil)
	testwait.Until(t, 15*time.Second, "engine started", func() (bool, string) {
		for _, sh := range n.Cluster().Local().Shards {
			if sh.URL != "" {
				return true, ""
			}
		}
		return false, fmt.Sprint(n.Cluster().Local().Shards)
	})
	rec := n.Cluster().Local()
	sh := rec.Shards[0]
	path := "/v1/engines/" + placement.EngineID(sh.ShardID, sh.SpecVersion) + "/metrics"
	want := fmt.Sprint([]promTargets{
		{Targets: []string{rec.API}, Labels: map[string]string{"node": "a", "__metrics_path__": "/metrics"}},
		{Targets: []string{rec.API}, Labels: map[string]string{"node": "a", "deployment": "chat", "shard": "chat-0", "engine": "fake", "__metrics_path__": path}},
	})
	var got []promTargets
	call(t, "GET", api(n, "/v1/prometheus/targets"), "", nil, &got)
	if fmt.Sprint(got) != want {
		t.Errorf("targets %v, want %v", got, want)
	}
}
