//go:build cgo

package gpu

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// The H200 fixture's readings (gpuprobe.json: util_gpu 100, temp_c 58,
// power_mw 691422) through the NVML mock.
func TestTelemetryH200(t *testing.T) {
	raw, err := os.ReadFile("../testdata/h200/gpuprobe.json")
	if err != nil {
		t.Fatal(err)
	}
	var pj struct {
		Devices []struct {
			UtilGPU uint32 `json:"util_gpu"`
			TempC   uint32 `json:"temp_c"`
			PowerMW uint32 `json:"power_mw"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(raw, &pj); err != nil {
		t.Fatal(err)
	}
	fx := pj.Devices[0]
	h := newH200(t, symMemoryInfoV2)
	h.dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		return nvml.Utilization{Gpu: fx.UtilGPU, Memory: 37}, nvml.SUCCESS
	}
	h.dev.GetTemperatureFunc = func(s nvml.TemperatureSensors) (uint32, nvml.Return) {
		if s != nvml.TEMPERATURE_GPU {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		return fx.TempC, nvml.SUCCESS
	}
	h.dev.GetPowerUsageFunc = func() (uint32, nvml.Return) { return fx.PowerMW, nvml.SUCCESS }
	h.dev.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 700000, nvml.SUCCESS }
	n := NewNVML(h.lib)
	got, err := n.Telemetry(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("telemetry = %+v", got)
	}
	g := got[0]
	if g.Index != 0 || g.UUID != "GPU-8b38414a-24cf-3fdb-ca7d-672639ff58e5" || g.UtilPct != 100 || g.MemUtilPct != 37 ||
		g.TempC != 58 || g.PowerW != 691.422 || g.PowerLimitW != 700 || !g.HasUtil || !g.HasTemp || !g.HasPower || len(g.Warnings) != 0 {
		t.Errorf("telemetry = %+v", g)
	}
	// Telemetry and Discover share one Init.
	if _, err := n.Discover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c := len(h.lib.InitCalls()); c != 1 {
		t.Errorf("Init called %d times", c)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Telemetry(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

// A board without a power sensor says NOT_SUPPORTED: power is unknown, not
// 0 W, and the rest is read.
func TestTelemetryPartial(t *testing.T) {
	h := newH200(t)
	h.dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 250}, nvml.SUCCESS }
	h.dev.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 41, nvml.SUCCESS }
	h.dev.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	h.dev.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	got, err := NewNVML(h.lib).Telemetry(context.Background())
	if err != nil || len(got) != 1 {
		t.Fatalf("telemetry = %+v, %v", got, err)
	}
	g := got[0]
	if g.HasPower || g.PowerW != 0 || !g.HasTemp || g.TempC != 41 || g.UtilPct != 100 || len(g.Warnings) != 1 {
		t.Errorf("telemetry = %+v", g)
	}
}

// No NVML library: no telemetry and no error, like Discover.
func TestTelemetryNoLibrary(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	got, err := NewNVML(lib).Telemetry(context.Background())
	if err != nil || len(got) != 0 {
		t.Errorf("telemetry = %+v, %v", got, err)
	}
}
