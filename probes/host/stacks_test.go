package host

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
)

// tickingClock is a fake clock that its Sleep moves forward by the
// durations asked for, so rounds are stamped as if the gap had passed,
// without waiting, and the test sees every wait asked for.
type tickingClock struct {
	*clock.Fake
	mu     sync.Mutex
	slept  []time.Duration
	failAt int // Sleep returns an error on this call (1-based); 0 never
}

func newTickingClock() *tickingClock { return &tickingClock{Fake: clock.NewFake(stampTime)} }

func (c *tickingClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slept = append(c.slept, d)
	if len(c.slept) == c.failAt {
		return context.Canceled
	}
	c.Advance(d)
	return nil
}

// A hung engine: the same stack every round.
const hungStack = `Process 4100: python3 -m vllm.entrypoints.openai.api_server
Python v3.12.11 (/usr/bin/python3.12)

Thread 4100 (idle): "MainThread"
    select (selectors.py:468)
    _run_once (asyncio/base_events.py:1949)
Process 4188: VLLM::EngineCore
Thread 4188 (active): "MainThread"
    synchronize (torch/cuda/__init__.py:985)
    execute_model (vllm/v1/worker/gpu_model_runner.py:1403)
`

func TestEngineStacks(t *testing.T) {
	clk := newTickingClock()
	fr := newFakeRunner(t, map[string]result{
		"py-spy dump --pid 4100 --subprocesses": {out: hungStack},
		"py-spy dump --pid 5200 --subprocesses": {out: "Process 5200: python3\n"},
	})
	cfg := Config{
		Host: "n1", Runner: fr, Clock: clk, Sleep: clk.Sleep,
		Engines: func(context.Context) ([]EngineProcess, error) {
			return []EngineProcess{{Name: "chat-0", PID: 4100}, {Name: "embed-0", PID: 5200}}, nil
		},
	}
	out := call(t, cfg, "engine_stacks", Args{})
	if got := len(fr.Calls()); got != 6 {
		t.Errorf("%d dumps, want 3 rounds × 2 engines", got)
	}
	if len(clk.slept) != 2 || clk.slept[0] != DefaultStackGap || clk.slept[1] != DefaultStackGap {
		t.Errorf("slept %v, want two gaps of %s", clk.slept, DefaultStackGap)
	}
	for _, want := range []string{
		"py-spy dump --pid P --subprocesses, 3 rounds 2s apart\n",
		"===== round 1 of 3 at 22:53:56 =====\n----- chat-0 (pid 4100) -----\n" + hungStack + "----- embed-0 (pid 5200) -----\n",
		"===== round 2 of 3 at 22:53:58 =====\n",
		"===== round 3 of 3 at 22:54:00 =====\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if strings.Count(out, "synchronize (torch/cuda/__init__.py:985)") != 3 {
		t.Error("the hung frame should appear once per round")
	}

	// One engine by name.
	fr2 := newFakeRunner(t, fr.results)
	cfg.Runner = fr2
	clk.slept = nil
	call(t, cfg, "engine_stacks", Args{Name: "embed-0"})
	for _, c := range fr2.Calls() {
		if c != "py-spy dump --pid 5200 --subprocesses" {
			t.Errorf("ran %q", c)
		}
	}
	_, err := tool(t, cfg, "engine_stacks").Run(context.Background(), Args{Name: "nope"})
	if !errors.Is(err, ErrBadArgs) || !strings.Contains(err.Error(), "engines: chat-0, embed-0") {
		t.Errorf("unknown engine: %v", err)
	}

	// A call cancelled during the gap stops there.
	clk.slept, clk.failAt = nil, 1
	if _, err := tool(t, cfg, "engine_stacks").Run(context.Background(), Args{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled in the gap: %v", err)
	}
}

func TestEngineStacksRoundsConfigured(t *testing.T) {
	clk := newTickingClock()
	fr := newFakeRunner(t, map[string]result{"py-spy dump --pid 1 --subprocesses": {out: "x\n"}})
	cfg := Config{Host: "n1", Runner: fr, Clock: clk, Sleep: clk.Sleep, StackRounds: 5, StackGap: 500 * time.Millisecond,
		Engines: func(context.Context) ([]EngineProcess, error) { return []EngineProcess{{Name: "a", PID: 1}}, nil }}
	out := call(t, cfg, "engine_stacks", Args{})
	if len(fr.Calls()) != 5 || len(clk.slept) != 4 || !strings.Contains(out, "5 rounds 500ms apart") {
		t.Errorf("calls %d, slept %v\n%s", len(fr.Calls()), clk.slept, out)
	}
}

func TestEngineStacksWithoutEnginesOrPySpy(t *testing.T) {
	cfg := Config{Host: "n1", Runner: newFakeRunner(t, nil)}
	if out := call(t, cfg, "engine_stacks", Args{}); !strings.Contains(out, "no engine list is configured on n1") {
		t.Errorf("nil Engines: %q", out)
	}
	cfg.Engines = func(context.Context) ([]EngineProcess, error) { return nil, nil }
	if out := call(t, cfg, "engine_stacks", Args{}); !strings.Contains(out, "no engines run on n1") {
		t.Errorf("no engines: %q", out)
	}
	fr := newFakeRunner(t, nil)
	fr.missing["py-spy"] = true
	clk := newTickingClock()
	cfg = Config{Host: "n1", Runner: fr, Sleep: clk.Sleep,
		Engines: func(context.Context) ([]EngineProcess, error) { return []EngineProcess{{Name: "a", PID: 1}}, nil }}
	if out := call(t, cfg, "engine_stacks", Args{}); !strings.Contains(out, "(py-spy is not installed on n1:") {
		t.Errorf("no py-spy: %q", out)
	}
}
