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
type scheduler struct {
	mu        sync.Mutex
	maxSeqs   int
	capBlocks int
	blockSize int
	running   int
	used      int // blocks held by running sequences
	queue     []*seq
}

// seq is one sequence: queued, then running until released.
type seq struct {
	s      *scheduler
	tokens int
	blocks int
	// admitted is closed when the sequence starts running.
	admitted chan struct{}
	running  bool
}

func newScheduler(maxSeqs, capBlocks, blockSize int) *scheduler {
	return &scheduler{maxSeqs: maxSeqs, capBlocks: capBlocks, blockSize: blockSize}
}

func (s *scheduler) blocksFor(tokens int) int { return (tokens + s.blockSize - 1) / s.blockSize }

// admit queues a sequence of promptTokens and waits until it runs. It
// returns nil if ctx ended first (the client left), having taken it off
// the queue.
func (s *scheduler) admit(ctx context.Context, promptTokens int) *seq {
	q := &seq{s: s, tokens: promptTokens, blocks: s.blocksFor(promptTokens), admitted: make(chan struct{})}
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

// dispatch lets in waiting sequences from the head while they fit. The
// caller holds mu.
func (s *scheduler) dispatch() {
	for len(s.queue) > 0 && s.running < s.maxSeqs {
		q := s.queue[0]
		if s.running > 0 && s.used+q.blocks > s.capBlocks {
			return
		}
		s.queue = s.queue[1:]
		s.running++
		s.used += q.blocks
		q.running = true
		close(q.admitted)
	}
}

// finish ends a running sequence. The caller holds mu.
func (s *scheduler) finish(q *seq) {
	q.running = false
	s.running--
	s.used -= q.blocks
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

// load is the batch as vLLM's gauges show it.
func (s *scheduler) load() (running, waiting int, kvUsage float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running, len(s.queue), min(1, float64(s.used)/float64(s.capBlocks))
}
