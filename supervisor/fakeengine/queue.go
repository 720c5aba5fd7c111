package fakeengine

import (
	"context"
	"sync"
)

// scheduler is the fake's model of an engine's batch: at most maxSeqs
// sequences run at once, each holding KV-cache blocks for its tokens so
// far, and the rest wait in arrival order. The head of the queue is let in
// when a sequence slot is free and its prompt's blocks fit beside the
// running ones (or nothing runs: a prompt larger than the whole cache
// still runs, alone); nobody overtakes it, as under vLLM's FCFS policy.
// Running sequences grow without limit (the fake does not preempt), so
// usage can pass 1 and is reported clamped.
//
// With LoRA (see lora): at most maxLoRAs distinct adapters run at once.
// Under vLLM's rule (loraSkip) a waiting sequence whose adapter would be
// one too many is skipped and keeps its place while those behind it may
// pass, as vllm/v1/core/sched/scheduler.py Scheduler.schedule does
// ("Scheduling would exceed max_loras, skip": len(scheduled_loras) ==
// max_loras and the request's lora_int_id not among them; requests on the
// base model are never held back). Under SGLang's rule the base model
// takes a slot too and the sequence that does not fit stops the admission
// there (python/sglang/srt/managers/scheduler.py
// get_new_batch_prefill: can_run_lora_batch false, batch_is_full, break).
type scheduler struct {
	mu        sync.Mutex
	maxSeqs   int
	capBlocks int
	blockSize int
	running   int
	used      int // blocks held by running sequences
	queue     []*seq

	// maxLoRAs is 0 without LoRA.
	maxLoRAs    int
	loraSkip    bool
	baseCounts  bool
	loraRunning map[string]int // running sequences by adapter ("" the base)
	// changed, when set, is called (under mu) after every change to the
	// queue or the batch: the LoRA gauge records the state there.
	changed func()
}

// seq is one sequence: queued, then running until released.
type seq struct {
	s      *scheduler
	lora   string // the adapter's name; "" is the base model
	tokens int
	blocks int
	// admitted is closed when the sequence starts running.
	admitted chan struct{}
	running  bool
}

func newScheduler(maxSeqs, capBlocks, blockSize int) *scheduler {
	return &scheduler{maxSeqs: maxSeqs, capBlocks: capBlocks, blockSize: blockSize, loraRunning: map[string]int{}}
}

func (s *scheduler) blocksFor(tokens int) int { return (tokens + s.blockSize - 1) / s.blockSize }

// admit queues a sequence of promptTokens and waits until it runs. It
// returns nil if ctx ended first (the client left), having taken it off
// the queue.
func (s *scheduler) admit(ctx context.Context, promptTokens int) *seq {
	return s.admitLoRA(ctx, promptTokens, "")
}

// admitLoRA is admit for a sequence on adapter lora ("" the base model).
func (s *scheduler) admitLoRA(ctx context.Context, promptTokens int, lora string) *seq {
	q := &seq{s: s, lora: lora, tokens: promptTokens, blocks: s.blocksFor(promptTokens), admitted: make(chan struct{})}
	s.mu.Lock()
	s.queue = append(s.queue, q)
	s.dispatch()
	s.mu.Unlock()
	select {
	case <-q.admitted:
		return q
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if q.running {
		// Let in just as the client left.
		s.finish(q)
		return nil
	}
	for i, w := range s.queue {
		if w == q {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			break
		}
	}
	// The head may have been the one blocking the rest.
	s.dispatch()
	return nil
}

// dispatch lets in waiting sequences from the head while they fit, passing
// over those whose adapter may not run yet (vLLM's rule). The caller holds
// mu.
func (s *scheduler) dispatch() {
	defer s.notify()
	for i := 0; i < len(s.queue) && s.running < s.maxSeqs; {
		q := s.queue[i]
		if !s.loraFits(q.lora) {
			if s.loraSkip {
				i++
				continue
			}
			return
		}
		if s.running > 0 && s.used+q.blocks > s.capBlocks {
			return
		}
		s.queue = append(s.queue[:i], s.queue[i+1:]...)
		s.running++
		s.used += q.blocks
		s.loraRunning[q.lora]++
		q.running = true
		close(q.admitted)
	}
}

// loraFits reports whether a sequence on adapter lora may join the batch.
// The caller holds mu.
func (s *scheduler) loraFits(lora string) bool {
	if s.maxLoRAs <= 0 || s.loraRunning[lora] > 0 || (lora == "" && !s.baseCounts) {
		return true
	}
	distinct := 0
	for name, n := range s.loraRunning {
		if n > 0 && (name != "" || s.baseCounts) {
			distinct++
		}
	}
	return distinct < s.maxLoRAs
}

// notify tells the LoRA gauge the batch changed. The caller holds mu.
func (s *scheduler) notify() {
	if s.changed != nil {
		s.changed()
	}
}

// finish ends a running sequence. The caller holds mu.
func (s *scheduler) finish(q *seq) {
	q.running = false
	s.running--
	s.used -= q.blocks
	if s.loraRunning[q.lora]--; s.loraRunning[q.lora] <= 0 {
		delete(s.loraRunning, q.lora)
	}
	s.dispatch()
}

// grow adds n generated tokens to a running sequence.
func (q *seq) grow(n int) {
	s := q.s
	s.mu.Lock()
	defer s.mu.Unlock()
	q.tokens += n
	b := s.blocksFor(q.tokens)
	s.used += b - q.blocks
	q.blocks = b
}

// release ends the sequence and frees its blocks.
func (q *seq) release() {
	q.s.mu.Lock()
	defer q.s.mu.Unlock()
	if q.running {
		q.s.finish(q)
	}
}

// loraState is, for the adapters with a sequence in the engine, each
// one's sequences waiting and running, in the order of the queue and the
// batch. The caller holds mu.
func (s *scheduler) loraState() (waiting, running map[string]int) {
	waiting = map[string]int{}
	for _, q := range s.queue {
		if q.lora != "" {
			waiting[q.lora]++
		}
	}
	running = map[string]int{}
	for name, n := range s.loraRunning {
		if name != "" {
			running[name] = n
		}
	}
	return waiting, running
}

// load is the batch as vLLM's gauges show it.
func (s *scheduler) load() (running, waiting int, kvUsage float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running, len(s.queue), min(1, float64(s.used)/float64(s.capBlocks))
}

// hold keeps n blocks allocated outside any running sequence: a finished
// prefill's blocks waiting for a decode to read them (see holdLease).
func (s *scheduler) hold(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used += n
}

// freeHeld frees n held blocks and lets in whom they were keeping out.
func (s *scheduler) freeHeld(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used -= n
	s.dispatch()
}
