package overview

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/supervisor/datadir"
)

type countingGPUs struct {
	calls   atomic.Int32
	release chan struct{}
}

func (c *countingGPUs) Discover(ctx context.Context) (gpu.Snapshot, error) {
	c.calls.Add(1)
	<-c.release
	return gpu.Snapshot{}, nil
}

// A wedged driver is asked once, not once more every frame.
func TestHungNVMLIsNotAskedAgainUntilItAnswers(t *testing.T) {
	hung := &countingGPUs{release: make(chan struct{})}
	r := GPUsReader{GPUs: OneAtATime(hung)}
	for range 3 {
		s := section(context.Background(), 20*time.Millisecond, func(ctx context.Context) GPUsSection { return r.Read(ctx, stamp{}) },
			func(err error) GPUsSection { return GPUsSection{Note: "NVML " + err.Error()} })
		if !strings.Contains(s.Note, "does not answer") {
			t.Errorf("note = %q", s.Note)
		}
	}
	if n := hung.calls.Load(); n != 1 {
		t.Errorf("Discover called %d times while the first hung, want 1", n)
	}
	close(hung.release)
	testwait.Until(t, 5*time.Second, "the guard lets a new call through", func() (bool, string) {
		s := r.Read(context.Background(), stamp{})
		return hung.calls.Load() == 2, s.Note
	})
}

func TestHungStatfsIsNotAskedAgainUntilItAnswers(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int32
	statfs := OneStatfsAtATime(func(path string) (uint64, uint64, error) {
		if path == "/mnt/gone" {
			calls.Add(1)
			<-release
			return 0, 0, errors.New("stale file handle")
		}
		return 1, 2, nil
	})
	r := DisksReader{Statfs: statfs, WeightsDir: "/mnt/gone"}
	for range 3 {
		s := r.Read(datadir.New("/var/lib/llmgw"), stamp{}, 20*time.Millisecond)
		if s.Disks[1].Err == "" || s.Disks[0].Err != "" {
			t.Errorf("disks = %+v", s.Disks)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("statfs of the hung mount called %d times, want 1", n)
	}
	close(release)
	testwait.Until(t, 5*time.Second, "the hung mount is asked again once it answered", func() (bool, string) {
		s := r.Read(datadir.New("/var/lib/llmgw"), stamp{}, time.Second)
		return s.Disks[1].Err == "stale file handle", s.Disks[1].Err
	})
}

type fakeTelemetry []gpu.Telemetry

func (f fakeTelemetry) Telemetry(context.Context) ([]gpu.Telemetry, error) { return f, nil }

// probes/gpu's readings, as the H200 gave them, through FromNVML; a reading
// the driver refused shows a dash, not a zero.
func TestFromNVML(t *testing.T) {
	snap, rd := h200Fixture(t)
	tr := FromNVML(fakeTelemetry{{Index: 0, UtilPct: int(rd.UtilPercent), TempC: int(rd.TempC), PowerW: rd.PowerW, HasUtil: true, HasTemp: true}})
	s := GPUsReader{GPUs: snapGPUs{snap: snap}, Telemetry: tr}.Read(context.Background(), stamp{})
	out := Render(Frame{At: t0, GPUs: s}, 0, Plain())
	if !strings.Contains(out, "100%") || !strings.Contains(out, "58°C") || strings.Contains(out, "0W") || strings.Contains(out, "691W") {
		t.Errorf("frame (power not given, so a dash):\n%s", out)
	}
}
