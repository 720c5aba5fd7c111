package supervisor

import (
	"time"

	"github.com/llmgw/llmgw/placement"
)

// minHandover is the least time a replacement serves, as this node saw it,
// before the copy it replaces may stop (see handover). The local profile's
// spread bound on a few nodes is 400 ms (8 rounds of 50 ms); the floor
// leaves room for a node whose loop a busy machine holds up.
const minHandover = time.Second

// handover remembers when this node first saw each held copy's lease valid,
// so that placement can tell a replacement that has just become ready from
// one every node has seen ready (placement.HeldShard.Settling). Nodes see a
// new copy ready at different moments; without the wait, the holder of the
// old copy may stop it as soon as its own view shows the new one, while a
// gateway whose view lags still sees only the old one and answers 503. The
// control loop owns it.
type handover struct {
	since map[handoverKey]time.Time
	// next is when the earliest copy still settling settles (zero: none).
	next time.Time
}

// handoverKey is one claim: a copy that lapsed and claims afresh (a new
// stamp) settles again.
type handoverKey struct {
	node, shard, spec string
	claim             int64
}

// mark sets Settling on the valid held shards of v that this node first saw
// valid less than period before now, forgets the ones no longer valid, and
// notes when the next one settles. A node that has just started sees every
// copy for the first time: the copies they replace drain a little longer,
// never less.
func (h *handover) mark(v *placement.View, now time.Time, period time.Duration) {
	if h.since == nil {
		h.since = map[handoverKey]time.Time{}
	}
	seen := make(map[handoverKey]bool, len(h.since))
	h.next = time.Time{}
	for i := range v.Nodes {
		n := &v.Nodes[i]
		for j := range n.Shards {
			s := &n.Shards[j]
			if s.Lease != placement.LeaseValid {
				continue
			}
			k := handoverKey{n.Name, s.ShardID, s.SpecVersion, s.ClaimStamp}
			seen[k] = true
			first, ok := h.since[k]
			if !ok {
				first = now
				h.since[k] = now
			}
			if end := first.Add(period); now.Before(end) {
				s.Settling = true
				if h.next.IsZero() || end.Before(h.next) {
					h.next = end
				}
			}
		}
	}
	for k := range h.since {
		if !seen[k] {
			delete(h.since, k)
		}
	}
}
