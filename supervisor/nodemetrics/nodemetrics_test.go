package nodemetrics

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/mcpserver"
	"github.com/llmgw/llmgw/supervisor/supervisortest"
)

const token = "metrics-test-token-0123456789"

// startNode starts a real node on loopback with /metrics (and /mcp, whose
// tool-call histogram /metrics includes) registered as node up does.
func startNode(t *testing.T, name string, join ...int) (*supervisor.Node, int) {
	t.Helper()
	cfg := supervisortest.Config(t, name, join...)
	cfg.Token = token
	cfg.Extra = func(n *supervisor.Node, mux *http.ServeMux) {
		m := mcpserver.Register(n, mux, mcpserver.Options{})
		Register(n, mux, Options{ScrapeErrors: func() uint64 { return 3 }, Collectors: []prometheus.Collector{m}})
	}
	n := supervisortest.Start(t, cfg)
	return n, supervisortest.GossipPort(t, n)
}

func scrape(t *testing.T, n *supervisor.Node) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + n.APIAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %s: %s", resp.Status, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return fams
}

// value finds the sample of family name whose labels include want.
func value(fams map[string]*dto.MetricFamily, name string, want ...string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for i := 0; i+1 < len(want); i += 2 {
			match = match && labels[want[i]] == want[i+1]
		}
		if !match {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func TestMetricsFromTwoNodes(t *testing.T) {
	a, aport := startNode(t, "alpha")
	b, _ := startNode(t, "bravo", aport)
	put := func(spec string) {
		req, _ := http.NewRequest("POST", "http://"+a.APIAddr()+"/v1/deployments", strings.NewReader(spec))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("place: %s", resp.Status)
		}
	}
	put(`{"name":"chat","model":"m/tiny","engine":"fake","replicas":2}`)
	put(`{"name":"huge","model":"m/huge","engine":"fake","tensor_parallel":8}`)

	var fams map[string]*dto.MetricFamily
	testwait.Until(t, 20*time.Second, "bravo's metrics converge", func() (bool, string) {
		fams = scrape(t, b)
		alive, _ := value(fams, "llmgw_members", "state", "alive")
		ready, _ := value(fams, "llmgw_deployment_replicas", "deployment", "chat", "kind", "ready")
		unplaced, _ := value(fams, "llmgw_shards", "status", "unplaced")
		return alive == 2 && ready == 2 && unplaced == 1, fmt.Sprintf("alive=%v ready=%v unplaced=%v", alive, ready, unplaced)
	})
	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"llmgw_deployments", nil, 2},
		{"llmgw_members", []string{"state", "dead"}, 0},
		{"llmgw_deployment_replicas", []string{"deployment", "huge", "kind", "wanted"}, 1},
		{"llmgw_deployment_replicas", []string{"deployment", "huge", "kind", "placed"}, 0},
		{"llmgw_shards", []string{"status", "ready", "lease", "valid"}, 2},
		{"llmgw_gpu_memory_total_bytes", []string{"gpu", "3"}, 80 << 30},
		{"llmgw_gpu_faulted", []string{"gpu", "0"}, 0},
		{"llmgw_engine_scrape_errors_total", nil, 3},
		{"llmgw_gossip_memberlist_members", nil, 2},
		{"llmgw_gossip_token_mismatch_peers", nil, 0},
	}
	for _, c := range checks {
		got, ok := value(fams, c.name, c.labels...)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	for _, name := range []string{"llmgw_gossip_messages_total", "llmgw_reconcile_duration_seconds", "go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("%s missing", name)
		}
	}
	if got, _ := value(fams, "llmgw_gossip_messages_total", "direction", "received"); got == 0 {
		t.Errorf("bravo received no gossip messages?")
	}
	if h := fams["llmgw_mcp_tool_call_duration_seconds"]; h != nil && len(h.GetMetric()) > 0 {
		t.Errorf("tool-call histogram has series before any call: %v", h)
	}
	_ = a
}

// A record this node refused is counted by reason in /metrics: here one
// deployments.json left behind with a spec no API would accept.
func TestMetricsCountRefusedGossipRecords(t *testing.T) {
	cfg := supervisortest.Config(t, "alpha")
	bad := `{"format_version":1,"deployments":[{"name":"chat","spec":{"name":"chat","model":"m","engine":"nope","replicas":1},"stamp":{"wall":1,"origin":"alpha"}}]}`
	if err := os.WriteFile(datadir.New(cfg.DataDir).DeploymentsFile(), []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Extra = func(n *supervisor.Node, mux *http.ServeMux) { Register(n, mux, Options{NoProcessMetrics: true}) }
	n := supervisortest.Start(t, cfg)
	fams := scrape(t, n)
	if got, ok := value(fams, "llmgw_gossip_dropped_total", "reason", "invalid_deployment"); !ok || got != 1 {
		t.Errorf("llmgw_gossip_dropped_total{reason=invalid_deployment} = %v (present %v), want 1", got, ok)
	}
	if got, ok := value(fams, "llmgw_gossip_dropped_total", "reason", "malformed"); !ok || got != 0 {
		t.Errorf("llmgw_gossip_dropped_total{reason=malformed} = %v (present %v), want 0", got, ok)
	}
}

// Once a peer was probed, /metrics says how far this node's clock is from
// the cluster's: near zero for two nodes on one host.
func TestMetricsShowTheClockOffset(t *testing.T) {
	_, aport := startNode(t, "alpha")
	b, _ := startNode(t, "bravo", aport)
	testwait.Until(t, 10*time.Second, "bravo's /metrics has its clock offset", func() (bool, string) {
		got, ok := value(scrape(t, b), "llmgw_clock_offset_seconds")
		return ok && got > -1 && got < 1, fmt.Sprint(got, ok)
	})
}

// A node whose only peer is gone hears no one: /metrics says it is
// isolated, so an alert needs no log scraping; its peer, while it ran,
// said 0.
func TestMetricsSayWhenThisNodeIsIsolated(t *testing.T) {
	a, aport := startNode(t, "alpha")
	b, _ := startNode(t, "bravo", aport)
	testwait.Until(t, 10*time.Second, "alpha's /metrics says it is not isolated", func() (bool, string) {
		got, ok := value(scrape(t, a), "llmgw_isolated")
		return ok && got == 0 && len(a.Status().Members()) == 2, fmt.Sprint(got, ok)
	})
	_ = b.Kill()
	testwait.Until(t, 15*time.Second, "alpha's /metrics says it is isolated", func() (bool, string) {
		got, ok := value(scrape(t, a), "llmgw_isolated")
		return ok && got == 1, fmt.Sprint(got, ok)
	})
}
