package gossip

import (
	"fmt"
	"io"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
)

// BenchmarkRecordPropagation50 measures how long a NodeRecord change takes
// to reach every node of a 50-node cluster running in this process on real
// loopback sockets with the local profile. It reports the median and p90 of
// the iterations as custom metrics.
func BenchmarkRecordPropagation50(b *testing.B) {
	const n = 50
	prof, _ := ProfileByName("local")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	nodes := make([]*Cluster, n)
	for i := range nodes {
		c, err := New(Config{Name: fmt.Sprintf("n%02d", i), BindAddr: "127.0.0.1", Profile: prof, Logger: quiet},
			NodeRecord{Version: Version{Epoch: 1}, GPUs: gpus(8, fmt.Sprint(i))})
		if err != nil {
			b.Fatal(err)
		}
		nodes[i] = c
		defer c.Shutdown()
		if i > 0 {
			// Spread joins over earlier nodes so no single seed serves 49
			// push/pulls in a row, and retry: on a loaded 2-core machine a
			// push/pull can miss the local profile's 1 s TCP timeout.
			var err error
			for try := 0; try < 5; try++ {
				if _, err = c.Join([]string{nodes[i/2].Address()}); err == nil {
					break
				}
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	testwait.Until(b, 60*time.Second, "50 nodes converge", func() (bool, string) {
		for _, c := range nodes {
			if len(c.store.Nodes()) != n {
				return false, fmt.Sprint(len(c.store.Nodes()))
			}
		}
		return true, ""
	})
	var samples []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		src := nodes[i%n]
		start := time.Now()
		r := src.UpdateLocal(func(r *NodeRecord) { r.Labels = map[string]string{"iter": fmt.Sprint(i)} })
		testwait.Until(b, 30*time.Second, "change reaches everyone", func() (bool, string) {
			for _, c := range nodes {
				ns, ok := c.store.Node(src.cfg.Name)
				if !ok || ns.Record.Version.Newer(r.Version) || r.Version.Newer(ns.Record.Version) {
					return false, c.cfg.Name
				}
			}
			return true, ""
		})
		samples = append(samples, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	b.ReportMetric(float64(samples[len(samples)/2].Microseconds())/1000, "median-ms")
	b.ReportMetric(float64(samples[len(samples)*9/10].Microseconds())/1000, "p90-ms")
}
