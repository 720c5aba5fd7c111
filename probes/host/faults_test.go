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
	cfg := Config{Host: "h200-a", Runner: fr, Root: root, Clock: fixedClock{now}, Location: time.UTC}
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
	// Xid 13 was two hours ago: only the GPU at 3b is recently faulted.
	if got := d.RecentXidPCI(now); !slices.Equal(got, []string{"0000:3b:00"}) {
		t.Errorf("recent Xid GPUs = %v", got)
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
	out := call(t, Config{Host: "n1", Runner: fr, Clock: fixedClock{now}, Root: fstest.MapFS{}}, "driver_faults", Args{})
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
