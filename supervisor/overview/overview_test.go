package overview

import (
	"context"
	"os"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/llmgw/llmgw/internal/clock"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/charmbracelet/lipgloss"

	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/status"
)

// machine is a whole node for Overview.Read: a data dir with a stamp, two
// engines, an H200 and fake commands.
func machine(t *testing.T, api API, gpus gpu.Discoverer) (Overview, *fakeRunner) {
	t.Helper()
	d := newDataDir(t, "gpu-1", []string{"127.0.0.1:1"}, &datadir.Alive{At: t0.Add(-3 * time.Second), PID: os.Getpid(), Name: "gpu-1", API: "127.0.0.1:7070", Version: "dev"})
	saveShard(t, d, "llama-0", "llama", []int{0}, 8100, os.Getpid(), t0.Add(-2*time.Hour))
	saveShard(t, d, "llama-1", "llama", []int{0}, 8101, gonePID(t), t0.Add(-2*time.Hour))
	run := &fakeRunner{t: t, out: map[string]string{
		systemctlShow: "LoadState=loaded\nActiveState=active\nSubState=running\nActiveEnterTimestamp=Tue 2026-12-01 19:00:00 UTC\n",
		journalctl:    "time=2026-12-01T19:59:00Z level=WARN msg=\"engine llama-1 exited\" code=137\n",
		"dmesg -T":    "",
	}}
	clk := clock.NewFake(t0)
	o := Overview{Dir: d, Clock: clk, Timeout: 200 * time.Millisecond,
		Agent:    AgentReader{Run: run, API: api, Version: "dev", DataDir: d.Root()},
		Peers:    PeersReader{API: api, Dial: func(context.Context, string) error { return nil }},
		GPUs:     GPUsReader{GPUs: gpus},
		Engines:  EnginesReader{API: api},
		Disks:    DisksReader{Statfs: func(string) (uint64, uint64, error) { return 50 << 30, 100 << 30, nil }},
		Problems: ProblemsReader{Run: run, Root: true},
		Faults:   FaultsReader{Run: run, Clock: clk, Root: fstest.MapFS{}, AsRoot: true},
	}
	return o, run
}

func TestReadWholeMachine(t *testing.T) {
	snap, _ := h200Fixture(t)
	api := &fakeAPI{answers: map[string]any{
		"/healthz":    "ok",
		"/v1/cluster": status.ClusterInfo{Self: "gpu-1", Members: []status.MemberInfo{{Name: "gpu-1"}, {Name: "gpu-2", State: "alive", Gossip: "127.0.0.1:7947"}}},
		"/v1/shards":  []status.ShardInfo{{ShardID: "llama-0", SpecVersion: "abc123", Node: "gpu-1", Lease: "valid", Status: "ready"}},
	}}
	o, _ := machine(t, api, snapGPUs{snap: snap})
	f := o.Read(context.Background())
	out := Render(f, 80, Plain())
	for _, want := range []string{"gpu-1", "active (running)", "127.0.0.1:7070 answers", "gpu-2", "reachable", "NVIDIA H200",
		"llama-0", "llama-1", "valid", "gone", "engine llama-1 exited", "kernel, NVIDIA driver", "Disks"} {
		if !strings.Contains(out, want) {
			t.Errorf("frame lacks %q:\n%s", want, out)
		}
	}
	if f.GPUs.GPUs[0].Models[0] != "llama" {
		t.Errorf("models on GPU 0 = %q", f.GPUs.GPUs[0].Models)
	}
	for _, l := range strings.Split(out, "\n") {
		if lipgloss.Width(l) > 80 {
			t.Errorf("line wider than 80: %q", l)
		}
	}
	if strings.Contains(out, "\x1b[") {
		t.Errorf("plain frame has escape codes")
	}
}

// Hung sources (the driver, the agent's API) bound the frame and say so;
// the local sections are still there.
func TestReadWithHungSources(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	o, run := machine(t, &fakeAPI{hang: true}, snapGPUs{hang: release})
	run.hang = map[string]bool{systemctlShow: true}
	done := make(chan Frame, 1)
	go func() { done <- o.Read(context.Background()) }()
	var f Frame
	select {
	case f = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Read did not return with a hung NVML and API")
	}
	if f.GPUs.Note != "NVML does not answer" {
		t.Errorf("GPUs = %+v", f.GPUs)
	}
	if f.Agent.APIErr == "" || f.Agent.Note != "" || !strings.Contains(f.Agent.ServiceNote, "systemd does not answer") || f.Agent.Stamp == nil {
		t.Errorf("agent = %+v, want systemd and the API each said not to answer, and the stamp shown", f.Agent)
	}
	if len(f.Engines.Engines) != 2 || !f.Engines.Engines[0].PIDAlive {
		t.Errorf("engines = %+v", f.Engines)
	}
}

// No NVML library: the machine has no GPU, which is not an error.
func TestReadWithoutNVML(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	o, _ := machine(t, goneAPI, gpu.NewNVML(lib))
	f := o.Read(context.Background())
	if len(f.GPUs.GPUs) != 0 || !strings.Contains(f.GPUs.Note, "no GPU on this machine") {
		t.Errorf("GPUs = %+v", f.GPUs)
	}
	out := Render(f, 0, Plain())
	if !strings.Contains(out, "agent does not answer since") || !strings.Contains(out, "remembered in node.json") {
		t.Errorf("frame:\n%s", out)
	}
}

func TestTableCutsFlexColumnAndNeverWraps(t *testing.T) {
	tb := Table{Head: []string{"NAME", "WHY"}, Flex: 1, Rows: [][]Cell{{C("chat"), C(strings.Repeat("no GPU has room ", 10))}}}
	out := tb.Render(40, "  ", Plain())
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 || lipgloss.Width(lines[1]) > 40 || !strings.HasSuffix(lines[1], "…") {
		t.Errorf("table:\n%s", out)
	}
	// Colour does not count toward the width.
	tb.Rows[0][1] = S("short", Colored(os.Stdout).Bad)
	if w := lipgloss.Width(strings.Split(tb.Render(40, "", Plain()), "\n")[1]); w != len("chat  short") {
		t.Errorf("width with a styled cell = %d", w)
	}
}

func TestTableLeavesOutOptionalColumnsWhenNarrow(t *testing.T) {
	tb := Table{Head: []string{"NAME", "WHY", "EXTRA", "MORE"}, Flex: 1, MinFlex: 4, Optional: []int{2, 3},
		Rows: [][]Cell{{C("chat"), C("a reason"), C("extra-wide-value"), C("more")}}}
	wide := tb.Render(0, "", Plain())
	if !strings.Contains(wide, "extra-wide-value") || !strings.Contains(wide, "MORE") {
		t.Errorf("wide:\n%s", wide)
	}
	narrow := tb.Render(24, "", Plain())
	if strings.Contains(narrow, "EXTRA") || !strings.Contains(narrow, "MORE") {
		t.Errorf("at 24 columns EXTRA (first optional) should go, MORE stay:\n%s", narrow)
	}
	for _, l := range strings.Split(strings.TrimSuffix(narrow, "\n"), "\n") {
		if lipgloss.Width(l) > 24 {
			t.Errorf("line wider than 24: %q", l)
		}
	}
}

func TestAgo(t *testing.T) {
	for d, want := range map[time.Duration]string{40 * time.Second: "40s", 15 * time.Minute: "15m", 90 * time.Second: "1m30s", 26 * time.Hour: "1d2h", -time.Second: "0s"} {
		if got := Ago(d); got != want {
			t.Errorf("Ago(%v) = %q, want %q", d, got, want)
		}
	}
}
