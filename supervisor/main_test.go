package supervisor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/engine"
	"github.com/llmgw/llmgw/supervisor/fakeengine"
	"github.com/llmgw/llmgw/supervisor/runtime/process"
)

// TestMain lets the test binary serve as the fake engine (see
// fakeengine.MainForTests) for the tests that run a node with real engines.
func TestMain(m *testing.M) {
	if code, ok := fakeengine.MainForTests(os.Args[1:]); ok {
		os.Exit(code)
	}
	// Every test stops what it started: nodes, runners and their watchers.
	goleak.VerifyTestMain(m)
}

// processRunner opens an engine runner over the process runtime in dir, as
// an agent (re)start would, running the fake engine from this test binary.
func processRunner(t *testing.T, dir string) *engine.Runner {
	t.Helper()
	return processRunnerAs(t, dir, "a", nil)
}

// processRunnerAs is processRunner for node name, tracing with tracer
// (nil: no traces).
func processRunnerAs(t *testing.T, dir, name string, tracer trace.Tracer) *engine.Runner {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dd := datadir.New(dir)
	rt, err := process.New(dd.RuntimeDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		engines, _ := rt.List(context.Background(), "")
		for _, x := range engines {
			_ = rt.Stop(context.Background(), x.ID, time.Second)
		}
	})
	r, err := engine.NewRunner(context.Background(), engine.Config{
		Node: name, Runtime: rt, DataDir: dd, Host: "127.0.0.1", Self: self, SimulatedGPUs: true,
		// A range of its own: the engine package's tests, run beside these,
		// take 20100-20999.
		PortMin: 22100, PortMax: 22999, Poll: 50 * time.Millisecond, Grace: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Tracer: tracer,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func readyPID(r *engine.Runner, shard string) (int, string) {
	for _, s := range r.Shards() {
		if s.ShardID == shard && s.Ready {
			return s.PID, ""
		}
	}
	return 0, fmt.Sprint(r.Shards())
}

// A graceful leave (SIGTERM) must never stop engines: the next agent
// adopts them. Before the fix, a last reconcile after the node marked
// itself leaving planned nothing here and stopped them, about one time in
// four.
func TestGracefulLeaveKeepsEngines(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t)
	cfg := h.config("a")
	for round := 0; round < 4; round++ {
		r := processRunner(t, dir)
		cfg.Runner = r
		n, err := Start(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if round == 0 {
			call(t, "POST", api(n, "/v1/deployments"), testToken, []byte(`{"name":"chat","model":"m","engine":"fake"}`), nil)
		}
		testwait.Until(t, 15*time.Second, "engine ready", func() (bool, string) {
			pid, detail := readyPID(r, "chat-0")
			return pid > 0, detail
		})
		pid, _ := readyPID(r, "chat-0")
		if err := n.Leave(time.Second); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("round %d: the engine (pid %d) died with a graceful leave: %v", round, pid, err)
		}
	}
}
