package gossip

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
)

// Stamp is a hybrid logical clock reading: wall milliseconds, a logical
// counter for events within one millisecond (or while the wall clock lags a
// stamp already seen), and the origin node's name to break exact ties. Stamps
// are totally ordered, so last-writer-wins needs no coordination.
type Stamp struct {
	Wall    int64  `json:"wall"`
	Logical uint32 `json:"logical"`
	Origin  string `json:"origin"`
}

// Less orders stamps by wall time, then logical counter, then origin name.
func (s Stamp) Less(o Stamp) bool {
	if s.Wall != o.Wall {
		return s.Wall < o.Wall
	}
	if s.Logical != o.Logical {
		return s.Logical < o.Logical
	}
	return s.Origin < o.Origin
}

func (s Stamp) String() string {
	return fmt.Sprintf("%s+%d@%s", time.UnixMilli(s.Wall).UTC().Format(time.RFC3339Nano), s.Logical, s.Origin)
}

// HLC issues stamps that never go backwards, even when the wall clock does,
// and that are later than every stamp this node has witnessed. The second
// property is what makes "the newest write wins" mean what an operator
// expects: an unplace issued after seeing a place beats it, whatever the
// clocks of the two nodes say.
type HLC struct {
	mu     sync.Mutex
	clock  clock.Clock
	origin string
	last   Stamp
}

// NewHLC returns a clock for origin reading wall time from clk.
func NewHLC(origin string, clk clock.Clock) *HLC {
	return &HLC{clock: clk, origin: origin}
}

// Now returns a stamp later than every stamp issued or witnessed so far.
func (h *HLC) Now() Stamp {
	h.mu.Lock()
	defer h.mu.Unlock()
	wall := h.clock.Now().UnixMilli()
	switch {
	case wall > h.last.Wall:
		h.last = Stamp{Wall: wall, Origin: h.origin}
	case h.last.Logical == math.MaxUint32:
		// Carry rather than wrap: a wrapped counter would issue a stamp
		// older than the last. One millisecond ahead of the wall clock is
		// far inside MaxClockOffset.
		h.last = Stamp{Wall: h.last.Wall + 1, Origin: h.origin}
	default:
		h.last = Stamp{Wall: h.last.Wall, Logical: h.last.Logical + 1, Origin: h.origin}
	}
	return h.last
}

// Witness moves the clock past a stamp seen from another node.
func (h *HLC) Witness(s Stamp) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last.Wall < s.Wall || (h.last.Wall == s.Wall && h.last.Logical < s.Logical) {
		h.last = Stamp{Wall: s.Wall, Logical: s.Logical, Origin: h.origin}
	}
}
