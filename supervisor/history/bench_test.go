package history

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// BenchmarkSample500Nodes is one sample of a 500-node cluster with 50
// deployments (each with an engine reading), as every node takes one
// every 10 s, and the memory a full hour of rings holds (ring-bytes).
func BenchmarkSample500Nodes(b *testing.B) {
	w := &world{}
	for i := range 500 {
		w.members = append(w.members, gpuNode(fmt.Sprintf("n%03d", i), 40, 10, 20, 30, 40, 50, 60, 70, 80))
	}
	for i := range 50 {
		name := fmt.Sprintf("d%02d", i)
		w.deps = append(w.deps, status.DeploymentInfo{Deployment: placement.Deployment{Name: name, Replicas: 2}, Ready: 2})
		w.shards = append(w.shards, loaded(name, 3, 1, 0.5))
	}
	clk := clock.NewFake(t0)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	r := New(Config{Self: "n000", Clock: clk, Status: func() Reading { return w },
		Traffic: func(time.Duration) []Traffic { return nil }})
	for range DefaultPoints {
		r.Sample()
		clk.Advance(DefaultStep)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r.Sample()
	}
	b.StopTimer()
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc), "ring-bytes")
	runtime.KeepAlive(r)
}
