//go:build cgo

package gpu

import (
	"context"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

var _ TelemetryReader = (*NVML)(nil)

// Telemetry reads utilisation, temperature and power of every GPU. Like
// Discover it initialises NVML on first use, reads nothing on a host
// without the library, and fails after Close. A reading the driver refuses
// (NOT_SUPPORTED on boards without a power sensor) leaves its Has flag
// false with a warning; a GPU whose handle cannot be taken is left out.
func (n *NVML) Telemetry(ctx context.Context) ([]Telemetry, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ok, err := n.ready(); !ok || err != nil {
		return nil, err
	}
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("gpu: nvml device count: %w", ret)
	}
	out := make([]Telemetry, 0, count)
	for i := range count {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		h, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		out = append(out, readTelemetry(i, h))
	}
	slices.SortFunc(out, func(a, b Telemetry) int { return a.Index - b.Index })
	return out, nil
}

func readTelemetry(i int, h nvml.Device) Telemetry {
	t := Telemetry{Index: i}
	warn := func(what string, ret nvml.Return) {
		t.Warnings = append(t.Warnings, fmt.Sprintf("GPU %d: %s: %v", t.Index, what, ret))
	}
	if idx, ret := h.GetIndex(); ret == nvml.SUCCESS {
		t.Index = idx
	}
	if uuid, ret := h.GetUUID(); ret == nvml.SUCCESS {
		t.UUID = uuid
	} else {
		warn("UUID", ret)
	}
	if u, ret := h.GetUtilizationRates(); ret == nvml.SUCCESS {
		t.UtilPct, t.MemUtilPct, t.HasUtil = clampPct(u.Gpu), clampPct(u.Memory), true
	} else {
		warn("utilisation", ret)
	}
	if c, ret := h.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		t.TempC, t.HasTemp = int(c), true
	} else {
		warn("temperature", ret)
	}
	if mw, ret := h.GetPowerUsage(); ret == nvml.SUCCESS {
		t.PowerW, t.HasPower = float64(mw)/1000, true
	} else {
		warn("power", ret)
	}
	// The limit is a detail: boards that report power but not a limit
	// (or refuse it without privileges) warn nothing.
	if mw, ret := h.GetEnforcedPowerLimit(); ret == nvml.SUCCESS {
		t.PowerLimitW = float64(mw) / 1000
	}
	return t
}

// clampPct keeps a percentage NVML gives as uint32 within 0-100.
func clampPct(v uint32) int { return int(min(v, 100)) }
