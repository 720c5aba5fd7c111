package host

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
)

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The H200's real NVRM lines: no Xid, five driver lines, two of them
// stamped in seconds since boot. The node booted at 22:53:18 UTC.
func TestDriverFaultsH200(t *testing.T) {
	boot := time.Date(2026, 11, 29, 22, 53, 18, 0, time.UTC)
	root := fstest.MapFS{"proc/stat": {Data: []byte("cpu  1 2 3\nbtime " + strconv.FormatInt(boot.Unix(), 10) + "\nprocesses 9\n")}}
	fr := newFakeRunner(t, map[string]result{"dmesg -T": {out: fixture(t, "dmesg-nvrm.txt")}})
	now := time.Date(2026, 11, 29, 22, 55, 0, 0, time.UTC)
	cfg := Config{Host: "h200-a", Runner: fr, Root: root, Clock: clock.NewFake(now), Location: time.UTC}
	out := call(t, cfg, "driver_faults", Args{})
	for _, want := range []string{
		"[h200-a 2026-11-29T22:55:00Z] dmesg -T | NVRM/Xid lines\n",
		"NVRM/Xid lines: 5 since boot, 5 in the last 15m0s\n",
		"Xid errors: 0 since boot, 0 in the last 15m0s\n",
		"newest: 2026-11-29T22:53:22Z (1m38s ago) NVRM: Persistence mode is deprecated",
		"2026-11-29T22:53:19Z NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)\n",
		// "[    1.726829]" is boot + 1.7 s.
		"2026-11-29T22:53:19Z NVRM: gpuClearFbhubPoisonIntrForBug2924523_GA100: FBHUB Interrupt detected. Clearing it.\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	// None of the healthy H200's lines is a fault: the load banner, the
	// interrupt cleared at boot, the deprecation notice.
	for _, want := range []string{
		"faults (Xid and NVRM errors): 0 since boot, 0 in the last 15m0s\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "FAULT ") || strings.Contains(out, "newest fault:") {
		t.Errorf("a healthy line was called a fault:\n%s", out)
	}
	healthy := ParseDriverFaults(fixture(t, "dmesg-nvrm.txt"), now, DefaultFaultWindow, time.UTC, boot)
	if healthy.FaultTotal != 0 || healthy.FaultRecent != 0 || healthy.NewestFault != nil {
		t.Errorf("H200 fixture: %d faults (%d recent), newest %+v; want none", healthy.FaultTotal, healthy.FaultRecent, healthy.NewestFault)
	}
	gpus := []placement.GPU{{Index: 0, PCIBusID: "00000000:00:06.0"}}
	if MarkFaulted(gpus, healthy, now)[0].Faulted {
		t.Error("the healthy H200 was marked faulted")
	}
	// An hour later the same lines are history.
	later := ParseDriverFaults(fixture(t, "dmesg-nvrm.txt"), now.Add(time.Hour), DefaultFaultWindow, time.UTC, boot)
	if later.Total != 5 || later.Recent != 0 || later.XidTotal != 0 {
		t.Errorf("an hour later: %+v", later)
	}
	// Without the boot time, the raw-stamped lines count only since boot.
	noBoot := ParseDriverFaults(fixture(t, "dmesg-nvrm.txt"), now, DefaultFaultWindow, time.UTC, time.Time{})
	if noBoot.Total != 5 || noBoot.Recent != 3 {
		t.Errorf("without boot time: %+v", noBoot)
	}
}

func TestParseDriverFaultsXid(t *testing.T) {
	now := time.Date(2026, 11, 29, 23, 15, 0, 0, time.UTC)
	d := ParseDriverFaults(readTestdata(t, "dmesg-xid.txt"), now, 15*time.Minute, time.UTC, time.Time{})
	if d.Total != 5 || d.Recent != 3 || d.XidTotal != 3 || d.XidRecent != 2 {
		t.Errorf("counts: total %d recent %d xid %d xid recent %d", d.Total, d.Recent, d.XidTotal, d.XidRecent)
	}
	var xids []int
	for _, f := range d.Faults {
		xids = append(xids, f.Xid)
	}
	if !slices.Equal(xids, []int{0, 13, 79, 0, 48}) {
		t.Errorf("xids = %v", xids)
	}
	if d.Faults[2].PCI != "0000:3b:00" || d.Faults[3].PCI != "0000:3b:00.0" || d.Faults[1].PCI != "0000:18:00" {
		t.Errorf("PCI = %q %q %q", d.Faults[1].PCI, d.Faults[2].PCI, d.Faults[3].PCI)
	}
	if d.Newest == nil || d.Newest.Xid != 48 || !d.Newest.Time.Equal(time.Date(2026, 11, 29, 23, 12, 44, 0, time.UTC)) {
		t.Errorf("newest = %+v", d.Newest)
	}
	// Xid 13 was two hours ago: only the GPU at 3b is recently faulted
	// (by two Xids and the NVRM line saying it fell off the bus).
	if got, nodeWide := d.RecentFaults(now); !slices.Equal(got, []string{"0000:3b:00", "0000:3b:00.0"}) || nodeWide {
		t.Errorf("recent fault GPUs = %v, node-wide %v", got, nodeWide)
	}
	if d.FaultTotal != 4 || d.FaultRecent != 3 {
		t.Errorf("faults: total %d recent %d, want 4 and 3 (the banner is no fault)", d.FaultTotal, d.FaultRecent)
	}
	gpus := []placement.GPU{{Index: 0, PCIBusID: "0000:18:00.0"}, {Index: 1, PCIBusID: "0000:3b:00.0"}, {Index: 2}}
	marked := MarkFaulted(gpus, d, now)
	if marked[0].Faulted || !marked[1].Faulted || marked[2].Faulted || gpus[1].Faulted {
		t.Errorf("MarkFaulted = %+v (input %+v)", marked, gpus)
	}
	if !SamePCIDevice("0000:3b:00", "00000000:3B:00.0") || SamePCIDevice("0000:18:00", "0000:3b:00.0") ||
		!SamePCIDevice("0000:3b:00.0", "0000:3b:00.0") || SamePCIDevice("", "0000:3b:00.0") {
		t.Error("SamePCIDevice")
	}
}

// Xid lines as MIG-enabled GPUs and older drivers print them are Xids too,
// with their PCI address, and the newest Xid is told apart from the newest
// line (which may be a harmless banner).
func TestParseDriverFaultsXidForms(t *testing.T) {
	now := time.Date(2026, 11, 29, 23, 15, 0, 0, time.UTC)
	text := strings.Join([]string{
		"[Sun Nov 29 23:10:00 2026] NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 94, pid=1234, name=python, Contained ECC error.",
		"[Sun Nov 29 23:11:00 2026] NVRM: Xid (PCI:0000:5c:00 GPU-I:01 GPU-CI:02): 95, pid=99, Uncontained ECC error.",
		"[Sun Nov 29 23:12:00 2026] NVRM: Xid (0000:03:00): 14, Channel 00000001",
		"[Sun Nov 29 23:13:00 2026] NVRM: Persistence mode is deprecated and will be removed in a future release.",
	}, "\n")
	d := ParseDriverFaults(text, now, 15*time.Minute, time.UTC, time.Time{})
	var got []string
	for _, f := range d.Faults {
		got = append(got, fmt.Sprintf("%d@%s", f.Xid, f.PCI))
	}
	if want := []string{"94@0000:3b:00", "95@0000:5c:00", "14@0000:03:00", "0@"}; !slices.Equal(got, want) {
		t.Errorf("xid@pci = %v, want %v", got, want)
	}
	if d.XidRecent != 3 || d.NewestXid == nil || d.NewestXid.Xid != 14 || d.Newest == nil || d.Newest.Xid != 0 {
		t.Errorf("xid recent %d, newest xid %+v, newest %+v", d.XidRecent, d.NewestXid, d.Newest)
	}
}

// dmesg refused (dmesg_restrict): the kernel log comes from journalctl.
func TestDriverFaultsJournalFallback(t *testing.T) {
	fr := newFakeRunner(t, map[string]result{
		"dmesg -T": {out: "dmesg: read kernel buffer failed: Operation not permitted\n", err: exitError(t, 1)},
		"journalctl -k -b --no-pager -o short-iso": {out: readTestdata(t, "journal-xid.txt")},
	})
	now := time.Date(2026, 11, 29, 23, 15, 0, 0, time.UTC)
	out := call(t, Config{Host: "n1", Runner: fr, Clock: clock.NewFake(now), Root: fstest.MapFS{}}, "driver_faults", Args{})
	for _, want := range []string{
		"] journalctl -k -b --no-pager -o short-iso | NVRM/Xid lines\n",
		"dmesg: read kernel buffer failed: Operation not permitted\n(dmesg -T exited with status 1)\n",
		"NVRM/Xid lines: 2 since boot, 1 in the last 15m0s\n",
		"  Xid 13 on GPU 0000:18:00: 1 since boot, 0 recent, last 2026-11-29T21:00:00Z\n",
		"  Xid 79 on GPU 0000:3b:00: 1 since boot, 1 recent, last 2026-11-29T23:10:01Z\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "e1000e") {
		t.Error("a non-driver line was kept")
	}
}

// This machine's kernel log, whatever it holds.
func TestDriverFaultsHere(t *testing.T) {
	out := call(t, Config{Host: "here"}, "driver_faults", Args{})
	if !strings.Contains(out, "NVRM/Xid lines: ") && !strings.Contains(out, "is not installed on here") {
		t.Errorf("out = %.1000s", out)
	}
}

// NVRM errors are faults beside Xids; notices are not. A fault that names
// no GPU counts for the whole node, one that names a GPU for that GPU.
func TestDriverFaultsNVRMErrors(t *testing.T) {
	now := time.Date(2026, 8, 27, 22, 40, 0, 0, time.UTC)
	lines := []struct {
		line  string
		fault bool
		pci   string
	}{
		{"[Thu Aug 27 22:13:26 2026] NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) returned from _memdescAllocInternal(pMemDesc) @ mem_desc.c:1359", true, ""},
		{"[Thu Aug 27 22:17:02 2026] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x22:0x56:667)", true, "0000:3b:00.0"},
		{"[Thu Aug 27 22:17:03 2026] NVRM: rm_init_adapter failed, device minor number 1", true, ""},
		{"[Thu Aug 27 22:18:00 2026] NVRM: GPU at PCI:0000:5c:00: GPU-d5b1f7f1-3e2b-11ef-8f9b-7cc2554a1a22", false, "0000:5c:00"},
		{"[Thu Aug 27 22:19:00 2026] NVRM: GPU 0000:5c:00.0: GPU has fallen off the bus.", true, "0000:5c:00.0"},
		{"[Thu Aug 27 22:20:00 2026] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)", false, ""},
		{"[Thu Aug 27 22:20:01 2026] NVRM: gpuClearFbhubPoisonIntrForBug2924523_GA100: FBHUB Interrupt detected. Clearing it.", false, ""},
		{"[Thu Aug 27 22:20:02 2026] NVRM: Persistence mode is deprecated and will be removed in a future release. Please use nvidia-persistenced instead.", false, ""},
		{"[Thu Aug 27 22:20:03 2026] NVRM: API mismatch: the client has the version 580.95.05, but this kernel module has the version 580.159.04.", true, ""},
	}
	var text []string
	for _, l := range lines {
		text = append(text, l.line)
	}
	d := ParseDriverFaults(strings.Join(text, "\n"), now, 30*time.Minute, time.UTC, time.Time{})
	if len(d.Faults) != len(lines) {
		t.Fatalf("%d lines kept, want %d", len(d.Faults), len(lines))
	}
	for i, l := range lines {
		if f := d.Faults[i]; f.Fault != l.fault || f.PCI != l.pci {
			t.Errorf("%q: fault %v pci %q, want %v %q", f.Message, f.Fault, f.PCI, l.fault, l.pci)
		}
	}
	if d.FaultTotal != 5 || d.FaultRecent != 5 || d.XidTotal != 0 {
		t.Errorf("faults %d recent %d xid %d; want 5 5 0", d.FaultTotal, d.FaultRecent, d.XidTotal)
	}
	if d.NewestFault == nil || !strings.Contains(d.NewestFault.Message, "API mismatch") {
		t.Errorf("newest fault = %+v", d.NewestFault)
	}
	pci, nodeWide := d.RecentFaults(now)
	if !nodeWide || !slices.Equal(pci, []string{"0000:3b:00.0", "0000:5c:00.0"}) {
		t.Errorf("recent faults %v node-wide %v", pci, nodeWide)
	}
	gpus := []placement.GPU{{Index: 0, PCIBusID: "0000:18:00.0"}, {Index: 1}}
	for _, g := range MarkFaulted(gpus, d, now) {
		if !g.Faulted {
			t.Errorf("GPU %d not marked though a fault named no GPU", g.Index)
		}
	}
	// Only GPU-named faults left in the window: only those GPUs.
	late := ParseDriverFaults(strings.Join(text[3:5], "\n"), now, 30*time.Minute, time.UTC, time.Time{})
	gpus = []placement.GPU{{Index: 0, PCIBusID: "0000:18:00.0"}, {Index: 1, PCIBusID: "0000:5c:00.0"}, {Index: 2}}
	got := MarkFaulted(gpus, late, now)
	if got[0].Faulted || !got[1].Faulted || got[2].Faulted {
		t.Errorf("marked %+v; want only GPU 1", got)
	}
	// Outside the window nothing is marked.
	if g := MarkFaulted(gpus, d, now.Add(time.Hour)); g[0].Faulted || g[1].Faulted || g[2].Faulted {
		t.Errorf("an hour later still marked: %+v", g)
	}
}
