package engine

import (
	"fmt"
	"sync"
	"time"
)

// startGateMax is how long one engine may hold its GPUs' start gate: a
// start that takes longer (a long download, a hung load) must not hold
// every other engine of those GPUs back for good. vLLM's own start-up
// limit is of this order (VLLM_ENGINE_READY_TIMEOUT_S, 600 s by default,
// vllm/envs.py).
const startGateMax = 10 * time.Minute

// startGate lets one engine at a time start on each GPU. vLLM requires
// free memory ≥ its fraction × total when it starts, and its profiler
// asserts that no other process's memory changed while it measured
// (vllm/v1/worker/gpu_worker.py, determine_available_memory): two engines
// loading onto one GPU at once shrink each other's KV cache or fail each
// other. So an engine waits, before it starts, until every engine
// starting on one of its GPUs is ready, has failed, or has held the gate
// for startGateMax. The gate has one owner, the runner; its own lock is
// a leaf (taken under no other, and taking none).
type startGate struct {
	mu sync.Mutex
	// holders maps a GPU index to the engine starting on it.
	holders map[int]gateHold
}

type gateHold struct {
	engine string
	since  time.Time
}

func newStartGate() *startGate { return &startGate{holders: map[int]gateHold{}} }

// acquire takes the gate of every GPU in gpus for engine, at now, or none
// of them: then wait says who holds which ("waiting for <engine> to finish
// starting on GPU n"). An engine that already holds a GPU keeps it; a hold
// older than startGateMax is taken over.
func (g *startGate) acquire(engine string, gpus []int, now time.Time) (wait string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, i := range gpus {
		h, held := g.holders[i]
		if held && h.engine != engine && now.Sub(h.since) < startGateMax {
			return fmt.Sprintf("waiting for %s to finish starting on GPU %d", h.engine, i)
		}
	}
	for _, i := range gpus {
		if h, held := g.holders[i]; !held || h.engine != engine {
			g.holders[i] = gateHold{engine: engine, since: now}
		}
	}
	return ""
}

// release gives up every GPU engine holds (it is ready, failed, stopped
// or waits to be started again). Releasing what is not held is harmless.
func (g *startGate) release(engine string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, h := range g.holders {
		if h.engine == engine {
			delete(g.holders, i)
		}
	}
}
