package supervisor

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/supervisor/status"
)

// readModel is what the node's readers see: the snapshot of the control
// loop's last pass (see Node.Status). The control loop stores it; every
// reader loads it. It also counts the deployment writes this node accepts,
// so that Place and Unplace can wait until a stored snapshot has seen
// theirs, and a client reads its own write back.
type readModel struct {
	clock clock.Clock
	snap  atomic.Pointer[status.Snapshot]
	// writes counts the deployment writes this node accepted; seen is how
	// many of them the stored snapshot saw.
	writes, seen atomic.Uint64
	mu           sync.Mutex
	// published is closed, and replaced under mu, at every store.
	published chan struct{}
	// closed is closed once the node stopped: no store comes any more.
	closed <-chan struct{}
	// wake makes the control loop pass now.
	wake wakeup
}

// maxWriteWait bounds how long a write waits to be seen: the loop
// reconciles within milliseconds of being woken, but a stopping node
// never will.
const maxWriteWait = 2 * time.Second

func newReadModel(clk clock.Clock, first *status.Snapshot, closed <-chan struct{}, wake wakeup) *readModel {
	m := &readModel{clock: clk, published: make(chan struct{}), closed: closed, wake: wake}
	m.snap.Store(first)
	return m
}

// load is the stored snapshot.
func (m *readModel) load() *status.Snapshot { return m.snap.Load() }

// written is how many deployment writes this node has accepted so far:
// read before a pass reads the gossip state, it is what the pass is sure
// to see.
func (m *readModel) written() uint64 { return m.writes.Load() }

// store makes snap what readers see; it saw the first saw deployment
// writes this node accepted.
func (m *readModel) store(snap *status.Snapshot, saw uint64) {
	m.snap.Store(snap)
	m.seen.Store(saw)
	m.mu.Lock()
	close(m.published)
	m.published = make(chan struct{})
	m.mu.Unlock()
}

// next is closed at the next store.
func (m *readModel) next() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.published
}

// awaitWrite counts one more accepted write and waits, at most
// maxWriteWait, until a stored snapshot has seen it.
func (m *readModel) awaitWrite() {
	w := m.writes.Add(1)
	m.wake.poke()
	deadline := m.clock.NewTimer(maxWriteWait)
	defer deadline.Stop()
	for m.seen.Load() < w {
		next := m.next()
		if m.seen.Load() >= w {
			return
		}
		select {
		case <-next:
		case <-deadline.Chan():
			return
		case <-m.closed:
			return
		}
	}
}
