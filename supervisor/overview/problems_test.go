package overview

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/llmgw/llmgw/internal/clock"

	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor/datadir"
)

func faultsOf(t *testing.T, now time.Time, lines []string) host.DriverFaults {
	t.Helper()
	return host.ParseDriverFaults(strings.Join(lines, "\n"), now, 15*time.Minute, time.UTC, now.Add(-24*time.Hour))
}

var journalctl = fmt.Sprintf("journalctl -u llmgw -p warning --since -1h -o cat --no-pager -n %d", problemLines)

func TestProblemsFromJournal(t *testing.T) {
	run := &fakeRunner{t: t, out: map[string]string{journalctl: "-- Boot 1234 --\n" +
		"time=2026-12-01T19:50:00Z level=WARN msg=\"engine not ready\" shard=chat-0\n" +
		"time=2026-12-01T19:55:00Z level=ERROR msg=\"start failed\" shard=chat-1\n"}}
	s := ProblemsReader{Run: run, Root: true}.Read(context.Background(), stamp{}, t0)
	if len(s.Lines) != 2 || !strings.Contains(s.Lines[0], "WARN msg=\"engine not ready\"") || !strings.HasPrefix(s.Lines[1], time.Date(2026, 12, 1, 19, 55, 0, 0, time.UTC).Local().Format("15:04:05")) {
		t.Errorf("lines = %q", s.Lines)
	}
	if len(s.NeedsRoot) != 0 || s.Note != "" {
		t.Errorf("section = %+v", s)
	}
}

func TestProblemsJournalUnreadable(t *testing.T) {
	run := &fakeRunner{t: t, out: map[string]string{journalctl: "No journal files were opened due to insufficient permissions.\n"}}
	s := ProblemsReader{Run: run}.Read(context.Background(), stamp{}, t0)
	if len(s.Lines) != 0 || len(s.NeedsRoot) != 1 {
		t.Errorf("section = %+v", s)
	}
	out := Render(Frame{At: t0, Problems: s}, 0, Plain())
	if !strings.Contains(out, "Run with sudo to read the agent's journal") || !strings.Contains(out, "run with sudo to read the agent's warnings") ||
		strings.Contains(out, "no warnings or errors") {
		t.Errorf("frame:\n%s", out)
	}
	// journalctl failing for another reason says so.
	run = &fakeRunner{t: t, out: map[string]string{journalctl: "Failed to open journal: Input/output error\n"}, errs: map[string]error{journalctl: errors.New("exit status 1")}}
	s = ProblemsReader{Run: run, Root: true}.Read(context.Background(), stamp{}, t0)
	if !strings.Contains(s.Note, "the journal cannot be read: Failed to open journal") {
		t.Errorf("note = %q", s.Note)
	}
	// No journal at all, and no log file named.
	run = &fakeRunner{t: t, missing: map[string]bool{"journalctl": true}}
	s = ProblemsReader{Run: run}.Read(context.Background(), stamp{}, t0)
	if !strings.Contains(s.Note, "journalctl not found") || len(run.ran()) != 0 {
		t.Errorf("note = %q", s.Note)
	}
}

// Not a service: the agent's stamp names its --log-file, and the journal
// is not asked.
func TestProblemsFromLogFile(t *testing.T) {
	log := filepath.Join(t.TempDir(), "node.log")
	text := "time=2026-12-01T18:00:00Z level=WARN msg=\"too old\"\n" +
		"time=2026-12-01T19:30:00Z level=INFO msg=\"fine\"\n" +
		"time=2026-12-01T19:31:00Z level=WARN msg=\"clock skew\" offset=16s\n" +
		"time=2026-12-01T19:32:00Z level=ERROR msg=\"save failed\"\n"
	if err := os.WriteFile(log, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	run := &fakeRunner{t: t}
	s := ProblemsReader{Run: run}.Read(context.Background(), stamp{found: true, alive: datadir.Alive{LogFile: log}}, t0)
	if len(s.Lines) != 2 || !strings.Contains(s.Lines[0], "clock skew") || !strings.Contains(s.Lines[1], "ERROR") || s.Source != log {
		t.Errorf("section = %+v", s)
	}
	if len(run.ran()) != 0 {
		t.Errorf("ran %q", run.ran())
	}
}

// The kernel log of the H200 fixture (dmesg -T and plain dmesg lines, no
// Xid), with one Xid appended inside the window.
func TestFaultsFromH200Dmesg(t *testing.T) {
	b, err := os.ReadFile("../../probes/testdata/h200/dmesg-nvrm.txt")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 29, 23, 10, 0, 0, time.Local)
	xid := "[Sun Nov 29 23:05:00 2026] NVRM: Xid (PCI:0000:00:06): 79, pid=448, GPU has fallen off the bus."
	run := &fakeRunner{t: t, out: map[string]string{"dmesg -T": string(b) + xid + "\n"}}
	f := FaultsReader{Run: run, Clock: clock.NewFake(now), Root: fstest.MapFS{"proc/stat": {Data: []byte("btime 1764456799\n")}}, AsRoot: true}.Read(context.Background())
	if f.err != "" || f.faults.Source != "dmesg -T" || f.faults.XidRecent != 1 {
		t.Fatalf("faults = %+v", f)
	}
	var p ProblemsSection
	p.addFaults(f, now)
	var g GPUsSection
	snap, _ := h200Fixture(t)
	g.GPUs = []GPURow{{Index: 0, PCIBusID: snap.GPUs[0].PCIBusID}}
	g.addFaults(f, now)
	if g.GPUs[0].RecentXids != 1 {
		t.Errorf("H200's recent Xids = %d", g.GPUs[0].RecentXids)
	}
	if len(p.Faults) == 0 || !strings.Contains(p.Faults[len(p.Faults)-1], "Xid (PCI:0000:00:06): 79") {
		t.Errorf("problems' faults = %q", p.Faults)
	}
	for _, l := range p.Faults {
		if strings.Contains(l, "loading NVIDIA UNIX") {
			t.Errorf("a line outside the 15m window: %q", l)
		}
	}
}

func TestFaultsDmesgRestricted(t *testing.T) {
	run := &fakeRunner{t: t, out: map[string]string{
		"dmesg -T": "dmesg: read kernel buffer failed: Operation not permitted\n",
		"journalctl -k -b --no-pager -o short-iso": "-- No entries --\n",
	}, errs: map[string]error{"dmesg -T": errors.New("exit status 1")}}
	f := FaultsReader{Run: run, Clock: clock.NewFake(t0), Root: fstest.MapFS{}}.Read(context.Background())
	var p ProblemsSection
	p.addFaults(f, t0)
	if len(p.NeedsRoot) != 1 || p.NeedsRoot[0] != "the kernel log" {
		t.Errorf("section = %+v", p)
	}
	if out := Render(Frame{At: t0, Problems: p}, 0, Plain()); !strings.Contains(out, "run with sudo to read the kernel log") || strings.Contains(out, "dmesg -T: none") {
		t.Errorf("frame:\n%s", out)
	}
}
