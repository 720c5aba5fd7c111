package host

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
)

const unitsLine = "systemctl list-units --type=service --state=running --no-pager --plain --no-legend"

// What systemctl prints for running services with --plain --no-legend.
const unitsOut = `containerd.service                 loaded active running containerd container runtime
llmgw.service                      loaded active running llmgw node agent
nvidia-fabricmanager.service       loaded active running NVIDIA fabric manager service
nvidia-persistenced.service        loaded active running NVIDIA Persistence Daemon
`

func TestSystemdUnitsRunsOneFixedCommandAndTabulates(t *testing.T) {
	fr := newFakeRunner(t, map[string]result{unitsLine: {out: unitsOut}})
	out := call(t, Config{Host: "n1", Runner: fr, Clock: clock.NewFake(stampTime)}, "systemd_units", Args{})
	if calls := fr.Calls(); len(calls) != 1 || calls[0] != unitsLine {
		t.Fatalf("ran %q, want only %q", calls, unitsLine)
	}
	for _, want := range []string{
		"[n1 2026-11-29T22:53:56Z] " + unitsLine + "\n",
		"4 services running\n",
		"UNIT                          LOAD    ACTIVE  SUB      DESCRIPTION\n",
		"nvidia-fabricmanager.service  loaded  active  running  NVIDIA fabric manager service\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if _, err := tool(t, Config{Runner: fr}, "systemd_units").Run(context.Background(), Args{View: "all"}); !errors.Is(err, ErrBadArgs) {
		t.Errorf("an argument it does not take: %v", err)
	}
}

func TestSystemdUnitsKeepsLinesItCannotRead(t *testing.T) {
	fr := newFakeRunner(t, map[string]result{unitsLine: {out: "cron.service loaded active running Regular background program\nsomething else\n"}})
	out := call(t, Config{Host: "n1", Runner: fr}, "systemd_units", Args{})
	if !strings.Contains(out, "1 service running\n") || !strings.Contains(out, "not in systemctl's usual form:\nsomething else\n") {
		t.Errorf("got\n%s", out)
	}
}

// No systemd is an answer, not an error: not installed, or installed but
// not the init system (this repository's CI container says the latter).
func TestSystemdUnitsWithoutSystemd(t *testing.T) {
	fr := newFakeRunner(t, nil)
	fr.missing["systemctl"] = true
	if out := call(t, Config{Host: "n1", Runner: fr}, "systemd_units", Args{}); !strings.Contains(out, "(no systemd on n1: systemctl is not installed)") {
		t.Errorf("not installed: %q", out)
	}
	notInit := "System has not been booted with systemd as init system (PID 1). Can't operate.\nFailed to connect to bus: Host is down\n"
	fr = newFakeRunner(t, map[string]result{unitsLine: {out: notInit, err: exitError(t, 1)}})
	out := call(t, Config{Host: "n1", Runner: fr}, "systemd_units", Args{})
	if !strings.Contains(out, "(systemd is not running on n1: it is not this host's init system") || !strings.Contains(out, "Failed to connect to bus") {
		t.Errorf("not the init system: %q", out)
	}
	fr = newFakeRunner(t, map[string]result{unitsLine: {out: "Access denied\n", err: exitError(t, 4)}})
	if out := call(t, Config{Host: "n1", Runner: fr}, "systemd_units", Args{}); !strings.Contains(out, "Access denied\n("+unitsLine+" exited with status 4)") {
		t.Errorf("failed: %q", out)
	}
}

func TestEngineStacksRoundsAndGapFromTheCall(t *testing.T) {
	clk := newTickingClock()
	fr := newFakeRunner(t, map[string]result{"py-spy dump --pid 1 --subprocesses": {out: "x\n"}})
	cfg := Config{Host: "n1", Runner: fr, Clock: clk, Sleep: clk.Sleep,
		Engines: func(context.Context) ([]EngineProcess, error) { return []EngineProcess{{Name: "a", PID: 1}}, nil }}
	out := call(t, cfg, "engine_stacks", Args{Rounds: 4, GapS: 0.5})
	if len(fr.Calls()) != 4 || len(clk.slept) != 3 || clk.slept[0] != 500*time.Millisecond || !strings.Contains(out, "4 rounds 500ms apart") {
		t.Errorf("calls %d, slept %v\n%s", len(fr.Calls()), clk.slept, out)
	}
	for _, bad := range []struct {
		a    Args
		want string
	}{
		{Args{Rounds: 11}, "rounds 11: want 1 to 10"},
		{Args{Rounds: -1}, "rounds -1: want 1 to 10"},
		{Args{GapS: 0.01}, "gap_s 0.01: want 0.1 to 10 seconds"},
		{Args{GapS: 60}, "gap_s 60: want 0.1 to 10 seconds"},
		{Args{GapS: -2}, "gap_s -2: want 0.1 to 10 seconds"},
	} {
		fr := newFakeRunner(t, nil)
		cfg.Runner = fr
		_, err := tool(t, cfg, "engine_stacks").Run(context.Background(), bad.a)
		if !errors.Is(err, ErrBadArgs) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want %q", bad.a, err, bad.want)
		}
		if len(fr.Calls()) != 0 {
			t.Errorf("%+v: ran %v before refusing", bad.a, fr.Calls())
		}
	}
	if _, err := tool(t, cfg, "gpu").Run(context.Background(), Args{Rounds: 2}); !errors.Is(err, ErrBadArgs) {
		t.Errorf("rounds on another tool: %v", err)
	}
}
