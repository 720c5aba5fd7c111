package gossip

import (
	"hash/maphash"
	"sync"
)

// seenMessages remembers the digests of the last gossip messages received,
// so a copy of one already taken is dropped before it is inflated and
// decoded. memberlist sends each broadcast RetransmitMult × log10(N)
// times from every node that relays it, so a node receives each beat and
// each record change several times (8 copies of every beat, measured on an
// idle 40-node cluster); the copies are byte for byte alike, since every
// node encodes a record from the same bytes. Taking a copy again would
// change nothing: the merge keeps a record only when it is news. Only a
// message taken whole is remembered: one with a record refused (its sender
// not yet known here, say) or a beat whose record has not arrived may be
// news when the same bytes come again, as a repair (Wants) sends them.
type seenMessages struct {
	seed maphash.Seed

	mu   sync.Mutex
	set  map[uint64]struct{}
	ring []uint64
	next int
}

// seenCapacity is how many digests are kept: more than the distinct
// messages a node receives over a broadcast's retransmit window in a
// cluster of hundreds.
const seenCapacity = 8192

func newSeenMessages() *seenMessages {
	return &seenMessages{seed: maphash.MakeSeed(), set: make(map[uint64]struct{}, seenCapacity), ring: make([]uint64, 0, seenCapacity)}
}

// digest is what seenMessages keeps of b.
func (s *seenMessages) digest(b []byte) uint64 { return maphash.Bytes(s.seed, b) }

// has reports whether a message of digest h was taken before.
func (s *seenMessages) has(h uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.set[h]
	return ok
}

// add remembers a message of digest h as taken, forgetting the oldest
// past seenCapacity.
func (s *seenMessages) add(h uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.set[h]; ok {
		return
	}
	if len(s.ring) < seenCapacity {
		s.ring = append(s.ring, h)
	} else {
		delete(s.set, s.ring[s.next])
		s.ring[s.next] = h
		s.next = (s.next + 1) % seenCapacity
	}
	s.set[h] = struct{}{}
}
