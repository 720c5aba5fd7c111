package supervisor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/host"
)

// A GPU with a recent Xid is marked faulted; when the kernel log cannot be
// read the next time, the mark stays (a read error must not make a
// faulting GPU placeable again), and it clears only on a reading without
// the fault.
func TestDriverFaultMarksSurviveAReadError(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var reading host.DriverFaults
	var readErr error
	n := &Node{log: slog.New(slog.NewTextHandler(io.Discard, nil)), clock: clock.NewFake(now), cfg: Config{
		DriverFaults: func(context.Context) (host.DriverFaults, error) { return reading, readErr },
	}}
	fresh := func() []placement.GPU {
		return []placement.GPU{
			{Index: 0, UUID: "GPU-a", PCIBusID: "00000000:18:00.0"},
			{Index: 1, UUID: "GPU-b", PCIBusID: "00000000:2A:00.0"},
		}
	}
	faulted := func(gpus []placement.GPU) []bool {
		out := make([]bool, len(gpus))
		for i, g := range gpus {
			out[i] = g.Faulted
		}
		return out
	}
	xid := host.DriverFault{Time: now.Add(-time.Minute), Message: "NVRM: Xid (PCI:0000:2a:00): 79, GPU has fallen off the bus", Xid: 79, PCI: "0000:2a:00", Fault: true}
	banner := host.DriverFault{Time: now.Add(-time.Second), Message: "NVRM: Persistence mode is deprecated and will be removed in a future release."}
	reading = host.DriverFaults{Window: time.Hour, FaultRecent: 1, FaultTotal: 1, XidRecent: 1, XidTotal: 1, Newest: &banner, NewestFault: &xid, NewestXid: &xid, Faults: []host.DriverFault{xid, banner}}

	gpus, probes := n.withFaults(context.Background(), fresh(), nil, gossip.ProbeSummary{})
	if got := faulted(gpus); got[0] || !got[1] {
		t.Fatalf("after an Xid on GPU 1: faulted = %v, want [false true]", got)
	}
	if probes.DriverFaultsRecent != 1 || probes.XidRecent != 1 || probes.LastDriverFault != xid.Message || !probes.LastDriverFaultAt.Equal(xid.Time) {
		t.Fatalf("probe summary = %+v", probes)
	}

	readErr = errors.New("dmesg: read kernel buffer failed: operation not permitted")
	gpus2, probes2 := n.withFaults(context.Background(), fresh(), gpus, probes)
	if got := faulted(gpus2); got[0] || !got[1] {
		t.Fatalf("after a failed read: faulted = %v, want the last marks [false true]", got)
	}
	if probes2 != probes {
		t.Fatalf("a failed read changed the probe summary: %+v", probes2)
	}

	readErr, reading = nil, host.DriverFaults{Window: time.Hour}
	gpus3, _ := n.withFaults(context.Background(), fresh(), gpus2, probes2)
	if got := faulted(gpus3); got[0] || got[1] {
		t.Fatalf("after a clean reading: faulted = %v, want none", got)
	}
}

// An NVRM error that names no GPU (the seed's NV_ERR_NO_MEMORY) counts
// beside Xids and marks every GPU of the node, simulated ones included:
// they have no PCI address to match, and such a fault may be any GPU's.
func TestNVRMFaultMarksTheWholeNode(t *testing.T) {
	now := time.Date(2026, 8, 27, 22, 40, 0, 0, time.UTC)
	text := "[Thu Aug 27 22:13:26 2026] NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) returned from _memdescAllocInternal(pMemDesc) @ mem_desc.c:1359\n" +
		"[Thu Aug 27 22:20:02 2026] NVRM: Persistence mode is deprecated and will be removed in a future release.\n"
	n := &Node{log: slog.New(slog.NewTextHandler(io.Discard, nil)), clock: clock.NewFake(now), cfg: Config{
		GPUsSimulated: true,
		DriverFaults: func(context.Context) (host.DriverFaults, error) {
			return host.ParseDriverFaults(text, now, 30*time.Minute, time.UTC, time.Time{}), nil
		},
	}}
	gpus, probes := n.withFaults(context.Background(), []placement.GPU{{Index: 0, UUID: "GPU-sim-0"}, {Index: 1, UUID: "GPU-sim-1"}}, nil, gossip.ProbeSummary{GPUsSimulated: true})
	for _, g := range gpus {
		if !g.Faulted {
			t.Errorf("GPU %d not marked faulted", g.Index)
		}
	}
	if probes.DriverFaultsRecent != 1 || probes.DriverFaultsBoot != 1 || probes.XidRecent != 0 ||
		!strings.Contains(probes.LastDriverFault, "NV_ERR_NO_MEMORY") || len(probes.LastDriverFault) > gossip.MaxFaultLine {
		t.Errorf("probe summary = %+v", probes)
	}
}

// Kernel lines are made to fit the record: printable and cut.
func TestFaultLineFitsTheRecord(t *testing.T) {
	long := "NVRM: " + strings.Repeat("é", gossip.MaxFaultLine)
	got := faultLine(long)
	if len(got) > gossip.MaxFaultLine || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Errorf("cut to %d bytes, valid %v: %q", len(got), utf8.ValidString(got), got)
	}
	if got := faultLine("NVRM: \x1b[2Jbad\tline"); got != "NVRM:  [2Jbad line" {
		t.Errorf("control characters kept: %q", got)
	}
}
