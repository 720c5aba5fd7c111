package overview

import (
	"context"
	"errors"
	"sync"

	"github.com/llmgw/llmgw/probes/gpu"
)

// errStillHung is a call not made because the last one of its kind has
// not returned yet.
var errStillHung = errors.New("does not answer (still stuck since the last refresh)")

// Neither an NVML call nor statfs can be cancelled: a wedged driver or a
// dead mount keeps its goroutine forever. A screen refreshed every three
// seconds would start one more every time; these guards let one call of a
// kind run at a time, and the next frame says it is still stuck instead.

// OneAtATime wraps d so that a Discover is refused, with an error, while
// the previous one has not returned.
func OneAtATime(d gpu.Discoverer) gpu.Discoverer { return &oneDiscover{d: d} }

type oneDiscover struct {
	d    gpu.Discoverer
	mu   sync.Mutex
	busy bool
}

func (o *oneDiscover) Discover(ctx context.Context) (gpu.Snapshot, error) {
	o.mu.Lock()
	if o.busy {
		o.mu.Unlock()
		return gpu.Snapshot{}, errStillHung
	}
	o.busy = true
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		o.busy = false
		o.mu.Unlock()
	}()
	return o.d.Discover(ctx)
}

// OneStatfsAtATime wraps statfs so that a path whose last call has not
// returned is not asked again until it does.
func OneStatfsAtATime(statfs func(string) (uint64, uint64, error)) func(string) (uint64, uint64, error) {
	var mu sync.Mutex
	busy := map[string]bool{}
	return func(path string) (uint64, uint64, error) {
		mu.Lock()
		if _, ok := busy[path]; ok {
			mu.Unlock()
			return 0, 0, errStillHung
		}
		busy[path] = true
		mu.Unlock()
		defer func() {
			mu.Lock()
			delete(busy, path)
			mu.Unlock()
		}()
		return statfs(path)
	}
}

// FromNVML adapts probes/gpu's telemetry reader to the GPUs section's
// Telemetry, one call at a time like OneAtATime (the reader shares NVML's
// lock with Discover, and neither can be cancelled). A reading the driver
// did not give is negative: the column shows a dash, not a zero.
func FromNVML(r gpu.TelemetryReader) Telemetry { return &nvmlTelemetry{r: r} }

type nvmlTelemetry struct {
	r    gpu.TelemetryReader
	mu   sync.Mutex
	busy bool
}

func (t *nvmlTelemetry) Telemetry(ctx context.Context) ([]GPUReading, error) {
	t.mu.Lock()
	if t.busy {
		t.mu.Unlock()
		return nil, errStillHung
	}
	t.busy = true
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.busy = false
		t.mu.Unlock()
	}()
	ts, err := t.r.Telemetry(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]GPUReading, 0, len(ts))
	for _, x := range ts {
		rd := GPUReading{Index: x.Index, UtilPercent: -1, TempC: -1, PowerW: -1}
		if x.HasUtil {
			rd.UtilPercent = float64(x.UtilPct)
		}
		if x.HasTemp {
			rd.TempC = float64(x.TempC)
		}
		if x.HasPower {
			rd.PowerW = x.PowerW
		}
		out = append(out, rd)
	}
	return out, nil
}
