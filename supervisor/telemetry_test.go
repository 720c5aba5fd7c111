package supervisor

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/probes/host"
)

// telemetryGPUs is a GPU probe that also reads telemetry, counting reads.
type telemetryGPUs struct {
	gpu.Simulated
	reads   int
	reading []gpu.Telemetry
}

func (g *telemetryGPUs) Telemetry(context.Context) ([]gpu.Telemetry, error) {
	g.reads++
	return slices.Clone(g.reading), nil
}

// Telemetry is read at most every loadPublishInterval, rounded, and
// republished only when the rounded values change.
func TestTelemetryIsRoundedAndThrottled(t *testing.T) {
	now := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	gpus := &telemetryGPUs{reading: []gpu.Telemetry{
		{Index: 0, UtilPct: 98, TempC: 58, PowerW: 691.422, HasUtil: true, HasTemp: true, HasPower: true},
		{Index: 1, UtilPct: 2, TempC: 31, HasUtil: true, HasTemp: true},
	}}
	links := []host.LinkRate{{Device: "mlx5_0", Port: 1, Up: true, TxMBps: 1234.5678, RxMBps: 0.04}}
	icReads := 0
	clk := clock.NewFake(now)
	n := &Node{log: slog.New(slog.NewTextHandler(io.Discard, nil)), clock: clk, cfg: Config{
		GPUs: gpus,
		Interconnect: func(context.Context) (host.Interconnect, error) {
			icReads++
			return host.Interconnect{Links: slices.Clone(links)}, nil
		},
	}}
	tel, changed := n.telemetryDue(context.Background(), gossip.Telemetry{})
	want := gossip.Telemetry{
		GPUs:   []gossip.GPUTelemetry{{Index: 0, UtilPct: 100, TempC: 58, PowerW: 690}, {Index: 1, UtilPct: 0, TempC: 31, NoPower: true}},
		Links:  []gossip.LinkRate{{Device: "mlx5_0", Port: 1, Up: true, TxMBps: 1234.6, RxMBps: 0}},
		ReadAt: now,
	}
	if !changed || !slices.Equal(tel.GPUs, want.GPUs) || !slices.Equal(tel.Links, want.Links) || !tel.ReadAt.Equal(now) {
		t.Fatalf("first reading: changed %v\n got %+v\nwant %+v", changed, tel, want)
	}
	// Within the interval nothing is read, whatever the GPUs do.
	clk.Advance(loadPublishInterval - time.Second)
	now = clk.Now()
	gpus.reading[0].UtilPct = 40
	if _, changed := n.telemetryDue(context.Background(), tel); changed || gpus.reads != 1 || icReads != 1 {
		t.Fatalf("within the interval: changed %v, %d GPU reads, %d link reads", changed, gpus.reads, icReads)
	}
	// Past it, a change the rounding hides is not republished.
	clk.Advance(time.Second)
	now = clk.Now()
	gpus.reading[0].UtilPct, gpus.reading[0].PowerW = 101, 688
	links[0].TxMBps = 1234.61
	if got, changed := n.telemetryDue(context.Background(), tel); changed || gpus.reads != 2 || !got.ReadAt.Equal(tel.ReadAt) {
		t.Fatalf("rounded alike: changed %v, %d reads, read at %v", changed, gpus.reads, got.ReadAt)
	}
	// A real change is.
	clk.Advance(loadPublishInterval)
	now = clk.Now()
	gpus.reading[1].UtilPct = 73
	got, changed := n.telemetryDue(context.Background(), tel)
	if !changed || got.GPUs[1].UtilPct != 75 || !got.ReadAt.Equal(now) {
		t.Fatalf("after a change: changed %v, %+v", changed, got)
	}
}
