package gossip

import (
	"sync"

	"github.com/hashicorp/memberlist"
)

// broadcast is one queued delta. Named, so a newer delta for the same node
// or deployment replaces the older one still waiting in the queue.
type broadcast struct {
	name string
	msg  []byte
}

var _ memberlist.NamedBroadcast = (*broadcast)(nil)

func (b *broadcast) Invalidates(o memberlist.Broadcast) bool {
	nb, ok := o.(memberlist.NamedBroadcast)
	return ok && nb.Name() == b.name
}
func (b *broadcast) Name() string    { return b.name }
func (b *broadcast) Message() []byte { return b.msg }
func (b *broadcast) Finished()       {}

// send queues m as a named broadcast, or sends it reliably to every member
// when it is too large for a packet.
func (c *Cluster) send(name string, m message) {
	b, err := encode(m)
	if err != nil {
		c.log.Error("encode gossip message", "err", err)
		return
	}
	if len(b) <= c.bigThreshold {
		c.queue.QueueBroadcast(&broadcast{name: name, msg: b})
		return
	}
	c.toEveryone(b)
}

// toEveryone sends b to every other member over TCP, each send in its own
// goroutine; the returned group is done when all have finished. A failed
// send is left to push/pull to repair.
func (c *Cluster) toEveryone(b []byte) *sync.WaitGroup {
	var done sync.WaitGroup
	for _, n := range c.ml.Members() {
		if n.Name == c.cfg.Name {
			continue
		}
		done.Add(1)
		if !c.spawn(func() {
			defer done.Done()
			if err := c.ml.SendReliable(n, b); err != nil {
				c.log.Debug("reliable send failed; push/pull will repair", "to", n.Name, "err", err)
				return
			}
			c.sent.Add(1)
			c.traffic.outDirect.Add(uint64(len(b)))
		}) {
			done.Done()
		}
	}
	return &done
}

// relay passes on a delta this node just learned, as gossip. A delta too
// big for a packet is not relayed: its origin sent it to every member over
// TCP already, and relaying it the same way would cost n² connections.
func (c *Cluster) relay(name string, m message) {
	b, err := encode(m)
	if err != nil || len(b) > c.bigThreshold {
		return
	}
	c.queue.QueueBroadcast(&broadcast{name: name, msg: b})
}

// sendLocalTo sends this node's record to one member over TCP.
func (c *Cluster) sendLocalTo(name string) {
	c.sendTo(name, message{Nodes: []NodeRecord{c.Local()}})
}

func (c *Cluster) sendTo(name string, m message) {
	var to *memberlist.Node
	for _, n := range c.ml.Members() {
		if n.Name == name {
			to = n
		}
	}
	if to == nil {
		return
	}
	b, err := encode(m)
	if err != nil {
		return
	}
	c.spawn(func() {
		if err := c.ml.SendReliable(to, b); err == nil {
			c.sent.Add(1)
			c.traffic.outDirect.Add(uint64(len(b)))
		}
	})
}
