package fakeengine

import (
	"sync"
	"time"
)

// interference is the opt-in step model (Config.StepInterference): in a
// real engine a prefill runs in the same forward steps as the running
// decodes, so every decode's next token waits for it. The fake keeps the
// sequences that are decoding, and a prefill of T uncached tokens adds
// T × the per-token prefill time to each one's next token. Without it (the
// default) sequences do not slow each other down, as the package doc
// says; with it, disaggregation shows why it is worth it.
type interference struct {
	mu      sync.Mutex
	running map[*decodeSlot]struct{}
}

// decodeSlot is one decoding sequence's debt: the delay its next token
// owes to prefills that ran meanwhile. Guarded by interference.mu.
type decodeSlot struct{ owed time.Duration }

// startDecoding registers a sequence that has its first token; nil when
// the model is off.
func (s *Server) startDecoding() *decodeSlot {
	if !s.cfg.StepInterference {
		return nil
	}
	d := &s.decoding
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running == nil {
		d.running = map[*decodeSlot]struct{}{}
	}
	slot := &decodeSlot{}
	d.running[slot] = struct{}{}
	return slot
}

// stopDecoding forgets a sequence.
func (s *Server) stopDecoding(slot *decodeSlot) {
	if slot == nil {
		return
	}
	s.decoding.mu.Lock()
	delete(s.decoding.running, slot)
	s.decoding.mu.Unlock()
}

// owed takes the delay a sequence's next token owes.
func (s *Server) owed(slot *decodeSlot) time.Duration {
	if slot == nil {
		return 0
	}
	s.decoding.mu.Lock()
	defer s.decoding.mu.Unlock()
	d := slot.owed
	slot.owed = 0
	return d
}

// interfere charges a prefill of uncached tokens to every decoding
// sequence.
func (s *Server) interfere(uncached int) {
	if !s.cfg.StepInterference || uncached <= 0 {
		return
	}
	d := time.Duration(int64(s.cfg.PrefillPer1KTokens) * int64(uncached) / 1000)
	s.decoding.mu.Lock()
	defer s.decoding.mu.Unlock()
	for slot := range s.decoding.running {
		slot.owed += d
	}
}
