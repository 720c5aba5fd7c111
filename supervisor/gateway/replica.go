package gateway

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/llmgw/llmgw/probes/load"
)

// replica is what the gateway learns about one upstream engine while
// routing to it: its load (loadEstimate), its health (ejection), and the
// attempts in flight to it, which it cuts when the engine leaves routing
// unready. It outlives table rebuilds (the gateway carries it over by
// route key), so a view change neither forgets an ejection nor loses the
// in-flight count.
type replica struct {
	load   loadEstimate
	health health
	// lora is the engine's LoRA slots in use as this gateway last
	// scraped them (nil: never, or no LoRA on its page).
	lora atomic.Pointer[load.LoRA]

	mu sync.Mutex
	// calls cancels the attempts in flight to the engine, by id, so that
	// an engine that leaves routing unready can be let go of (cut).
	calls    map[uint64]context.CancelCauseFunc
	lastCall uint64
	// cut is, once the engine left routing unready, why: an attempt that
	// begins after it chose the engine from the table just replaced, and
	// is cancelled at once.
	cut error
}

// track registers an attempt's cancel function until untrack; an attempt
// to an engine already cut is cancelled at once.
func (r *replica) track(cancel context.CancelCauseFunc) (id uint64) {
	r.mu.Lock()
	cut := r.cut
	if cut == nil {
		if r.calls == nil {
			r.calls = map[uint64]context.CancelCauseFunc{}
		}
		r.lastCall++
		id = r.lastCall
		r.calls[id] = cancel
	}
	r.mu.Unlock()
	if cut != nil {
		cancel(cut)
	}
	return id
}

func (r *replica) untrack(id uint64) {
	if id == 0 {
		return
	}
	r.mu.Lock()
	delete(r.calls, id)
	r.mu.Unlock()
}

// cutAll cancels every attempt in flight to the engine with cause, and
// those that begin until uncut.
func (r *replica) cutAll(cause error) {
	r.mu.Lock()
	r.cut = cause
	calls := r.calls
	r.calls = nil
	r.mu.Unlock()
	for _, cancel := range calls {
		cancel(cause)
	}
}

// uncut lets attempts to the engine run again: it is routable anew.
func (r *replica) uncut() {
	r.mu.Lock()
	r.cut = nil
	r.mu.Unlock()
}
