package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/overview"
)

func TestOverviewKeys(t *testing.T) {
	var lines []string
	for i := range 60 {
		lines = append(lines, fmt.Sprintf("bad-%02d.json: corrupt", i))
	}
	frame := overview.Frame{At: time.Now(), Engines: overview.EnginesSection{Bad: lines}}
	m := screenModel{read: func(context.Context) any { return frame }, draw: func(v any, w int) string { return overview.Render(v.(overview.Frame), w, overview.Plain()) },
		every: time.Hour, what: "reading this machine", keys: "q quit"}
	var tm tea.Model = m
	tm, _ = tm.Update(tea.WindowSizeMsg{Width: 80, Height: 20})
	if v := tm.View(); !strings.Contains(v, "reading this machine") {
		t.Errorf("before the first frame: %q", v)
	}
	tm, _ = tm.Update(screenDataMsg{frame})
	if v := tm.View(); !strings.HasPrefix(v, "llmgw overview") || strings.Count(v, "\n") != 19 {
		t.Errorf("first screen (%d lines):\n%s", strings.Count(v, "\n")+1, v)
	}
	tm, _ = tm.Update(tea.KeyMsg{Type: tea.KeyDown})
	if v := tm.View(); strings.HasPrefix(v, "llmgw overview") {
		t.Errorf("down did not scroll:\n%s", v)
	}
	for range 100 {
		tm, _ = tm.Update(tea.KeyMsg{Type: tea.KeyPgDown})
	}
	if v := tm.View(); !strings.Contains(v, "bad-59.json") || !strings.Contains(v, "kernel, NVIDIA driver") || !strings.HasSuffix(v, "q quit") {
		t.Errorf("the end of the frame is not reachable:\n%s", v)
	}
	tm, _ = tm.Update(tea.KeyMsg{Type: tea.KeyUp})
	if v := tm.View(); strings.Contains(v, "kernel, NVIDIA driver") {
		t.Errorf("up did not scroll back:\n%s", v)
	}
	_, cmd := tm.Update(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune{'q'}})
	if cmd == nil {
		t.Fatal("q: no command")
	}
	if _, ok := cmd().(tea.QuitMsg); !ok {
		t.Error("q does not quit")
	}
	// A tick while a read is in flight starts no second read.
	mm := tm.(screenModel)
	mm.busy = true
	if _, cmd := mm.Update(screenTickMsg{}); cmd == nil {
		t.Error("the tick stopped")
	}
}

func TestBareLlmgwPrintsHelpWithoutATerminal(t *testing.T) {
	t.Setenv("LLMGW_DATA_DIR", t.TempDir())
	out, err := run(t)
	if err != nil || !strings.Contains(out, "USAGE:") {
		t.Errorf("bare llmgw into a buffer: %v\n%s", err, out)
	}
	if _, err := run(t, "nosuchcommand"); err == nil || !strings.Contains(err.Error(), `no command "nosuchcommand"`) {
		t.Errorf("unknown command: %v", err)
	}
}

// A real node with the fake engine: the overview shows its engine and
// its GPUs; with the agent gone, the engine is still there, its pid alive,
// and the frame says since when the agent is silent.
func TestOverviewOnceOfARealNode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "n1")
	stopEngines(t, dir)
	n := startNode(t, "n1", dir, "--runtime", "process", "--engine-ports", "23200-23299", "--gateway-access-log=false")
	tok, err := os.ReadFile(datadir.New(dir).TokenFile())
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, "place", "chat", "--model", "m/tiny", "--engine", "fake", "--addr", n.api, "--token", strings.TrimSpace(string(tok))); err != nil {
		t.Fatalf("place: %v\n%s", err, out)
	}
	var frame string
	testwait.Until(t, 30*time.Second, "the overview shows chat-0 with a valid lease", func() (bool, string) {
		frame, err = run(t, "overview", "--data-dir", dir, "--once")
		return err == nil && strings.Contains(frame, "chat-0") && strings.Contains(frame, "valid"), frame
	})
	for _, want := range []string{"answers", "H100 80GB", "simulated", "alive", "fake"} {
		if !strings.Contains(frame, want) {
			t.Errorf("frame lacks %q:\n%s", want, frame)
		}
	}
	n.shutdown(t)
	frame, err = run(t, "overview", "--data-dir", dir, "--once")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"agent does not answer since", "chat-0", "alive", "leases not shown"} {
		if !strings.Contains(frame, want) {
			t.Errorf("agent down: frame lacks %q:\n%s", want, frame)
		}
	}
	if strings.Contains(frame, " gone") {
		t.Errorf("an engine outlives its agent, but the frame says gone:\n%s", frame)
	}
}
