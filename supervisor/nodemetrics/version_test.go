package nodemetrics

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/supervisor/status"
)

// versionSource is a node at a given cluster version, for the collector
// alone.
type versionSource struct {
	snap  *status.Snapshot
	stats gossip.Stats
	now   time.Time
}

func (s versionSource) Status() *status.Snapshot  { return s.snap }
func (s versionSource) Now() time.Time            { return s.now }
func (s versionSource) GossipStats() gossip.Stats { return s.stats }

// /metrics says which cluster version the node runs at, which versions its
// build speaks, whether versions are mixed, and how many peers it refuses.
func TestMetricsShowTheClusterVersion(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	snap := status.Build(status.Input{Self: "a", Now: now, TTL: 10 * time.Second, Members: []gossip.Member{
		{Name: "a", State: gossip.StateAlive, Protocol: protocol.Range{Min: 1, Max: 2}},
		{Name: "old", State: gossip.StateRefused, Protocol: protocol.Range{Min: 1, Max: 1}},
	}})
	for _, tc := range []struct {
		mixedSince time.Time
		mixed      float64
	}{{now.Add(-time.Minute), 1}, {time.Time{}, 0}} {
		src := versionSource{snap: snap, now: now, stats: gossip.Stats{ActiveVersion: 2, Protocol: protocol.Range{Min: 1, Max: 3}, VersionsMixedSince: tc.mixedSince}}
		fams, err := NewRegistry(src, Options{NoProcessMetrics: true}).Gather()
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]*dto.MetricFamily{}
		for _, f := range fams {
			byName[f.GetName()] = f
		}
		for _, c := range []struct {
			name   string
			labels []string
			want   float64
		}{
			{"llmgw_cluster_version", nil, 2},
			{"llmgw_protocol_version", []string{"bound", "min"}, 1},
			{"llmgw_protocol_version", []string{"bound", "max"}, 3},
			{"llmgw_versions_mixed", nil, tc.mixed},
			{"llmgw_members", []string{"state", "refused"}, 1},
		} {
			if got, ok := value(byName, c.name, c.labels...); !ok || got != c.want {
				t.Errorf("mixed since %v: %s%v = %v (present %v), want %v", tc.mixedSince, c.name, c.labels, got, ok, c.want)
			}
		}
	}
}
