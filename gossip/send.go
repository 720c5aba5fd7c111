package gossip

import (
	"slices"
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
	c.big.put(c, name, b, c.others())
}

// others is every member but this node.
func (c *Cluster) others() []*memberlist.Node {
	var to []*memberlist.Node
	for _, n := range c.ml.Members() {
		if n.Name != c.cfg.Name {
			to = append(to, n)
		}
	}
	return to
}

// bigWorkers bounds the sends over TCP in flight from one node.
const bigWorkers = 8

// bigQueue holds the messages too large for a packet on their way to
// every member over TCP: the newest one per name, and the members it is
// still due to. A record that changes again before it reached everyone
// goes on in its newer bytes to everyone (as a named broadcast replaces a
// queued one), so a burst of changes costs a member one send, not one per
// change; and at most bigWorkers sends are in flight. Before, every change
// went to every member at once, a goroutine each: a 100-node cluster
// settling in one process (scaletest) ran 9,400 of them and starved every
// node's loop. Names take turns, a member at a time, so one record's
// fan-out does not hold back another's.
type bigQueue struct {
	mu      sync.Mutex
	due     map[string]*bigDue
	names   []string // the names in due, in turn order
	workers int
}

type bigDue struct {
	b  []byte
	to []*memberlist.Node
}

// put makes b the message of its name due to every member in to.
func (q *bigQueue) put(c *Cluster, name string, b []byte, to []*memberlist.Node) {
	if len(to) == 0 {
		return
	}
	q.mu.Lock()
	d := q.dueLocked(name)
	// Members the older bytes had not reached yet are served first (next
	// takes from the end): with changes coming faster than a fan-out, a
	// fresh list each time would serve the same members first every time,
	// and the others never, whose beats for content they lack then renew
	// nothing, and their view of this node's leases lapses.
	behind := map[string]bool{}
	for _, n := range d.to {
		behind[n.Name] = true
	}
	member := map[string]*memberlist.Node{}
	order := make([]*memberlist.Node, 0, len(to))
	for _, n := range to {
		member[n.Name] = n
		if !behind[n.Name] {
			order = append(order, n)
		}
	}
	for _, n := range d.to { // in the order they were due
		if m, ok := member[n.Name]; ok {
			order = append(order, m)
		}
	}
	d.set(b, order)
	q.start(c)
}

// add makes b the message of its name and adds to to the members it is
// still due to.
func (q *bigQueue) add(c *Cluster, name string, b []byte, to *memberlist.Node) {
	q.mu.Lock()
	d := q.dueLocked(name)
	due := d.to
	if !slices.ContainsFunc(due, func(n *memberlist.Node) bool { return n.Name == to.Name }) {
		due = append(due, to)
	}
	d.set(b, due)
	q.start(c)
}

// dueLocked is name's entry, made if need be.
func (q *bigQueue) dueLocked(name string) *bigDue {
	if q.due == nil {
		q.due = map[string]*bigDue{}
	}
	d, ok := q.due[name]
	if !ok {
		d = &bigDue{}
		q.due[name] = d
		q.names = append(q.names, name)
	}
	return d
}

func (d *bigDue) set(b []byte, to []*memberlist.Node) { d.b, d.to = b, to }

// start unlocks q, starting a worker first if fewer than bigWorkers run.
func (q *bigQueue) start(c *Cluster) {
	start := q.workers < bigWorkers
	if start {
		q.workers++
	}
	q.mu.Unlock()
	if start && !c.spawn(func() { q.work(c) }) {
		q.mu.Lock()
		q.workers--
		q.mu.Unlock()
	}
}

// next takes one send off the queue; ok is false when none is left.
func (q *bigQueue) next() (to *memberlist.Node, b []byte, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.names) == 0 {
		q.workers--
		return nil, nil, false
	}
	name := q.names[0]
	d := q.due[name]
	to, b = d.to[len(d.to)-1], d.b
	d.to = d.to[:len(d.to)-1]
	q.names = q.names[1:]
	if len(d.to) == 0 {
		delete(q.due, name)
	} else {
		q.names = append(q.names, name)
	}
	return to, b, true
}

// work sends until the queue is empty or the cluster stops. A failed
// send is left to push/pull to repair.
func (q *bigQueue) work(c *Cluster) {
	for {
		select {
		case <-c.done:
			q.mu.Lock()
			q.workers--
			q.mu.Unlock()
			return
		default:
		}
		to, b, ok := q.next()
		if !ok {
			return
		}
		c.sendReliable(to, b)
	}
}

// sendReliable sends b to one member over TCP and counts it. A failed
// send is left to push/pull to repair.
func (c *Cluster) sendReliable(to *memberlist.Node, b []byte) {
	if err := c.ml.SendReliable(to, b); err != nil {
		c.log.Debug("reliable send failed; push/pull will repair", "to", to.Name, "err", err)
		return
	}
	c.sent.Add(1)
	c.traffic.outDirect.Add(uint64(len(b)))
}

// toEveryone sends b to every other member over TCP, at most bigWorkers
// at a time, and returns when every send has finished: for the last
// message of a node that leaves. A failed send is left to push/pull to
// repair.
func (c *Cluster) toEveryone(b []byte) {
	to := c.others()
	var wg sync.WaitGroup
	next := make(chan *memberlist.Node)
	for range min(bigWorkers, len(to)) {
		wg.Go(func() {
			for n := range next {
				c.sendReliable(n, b)
			}
		})
	}
	for _, n := range to {
		next <- n
	}
	close(next)
	wg.Wait()
}

// beatToAll sends this node's beat b to every other member as a packet of
// its own, marked From this node: its receivers do not relay it
// (receive), since it reached every member already. A receiver of an
// older release relays it all the same, unmarked, as any beat: that costs
// a mixed cluster the old bytes and breaks nothing. A beat is a hundred
// bytes, so the packets of 500 members cost 50 KB a renewal and a
// receiver one packet per member per renewal period.
func (c *Cluster) beatToAll(b Beat) {
	msg, err := encode(message{Beats: []Beat{b}, From: c.cfg.Name})
	if err != nil {
		c.log.Error("encode beat", "err", err)
		return
	}
	for _, n := range c.others() {
		if err := c.ml.SendBestEffort(n, msg); err == nil {
			c.sent.Add(1)
			c.traffic.outDirect.Add(uint64(len(msg)))
		}
	}
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

// sendLocalTo sends this node's record to one member (it asked for it).
// Through the big queue when it is too large for a packet, a record on its
// way to every member already goes to the asker once, in its newest bytes.
//
// The encoded record is kept for its version: in a large cluster settling
// many members ask for the same version (each saw a beat for content it
// lacked), and each encode deflates the whole record.
func (c *Cluster) sendLocalTo(name string) {
	r := c.Local()
	c.answerMu.Lock()
	if c.answer.b == nil || c.answer.version != r.Version {
		b, err := encode(localMessage(r))
		if err != nil {
			c.answerMu.Unlock()
			c.log.Error("encode own record", "err", err)
			return
		}
		c.answer.version, c.answer.b = r.Version, b
	}
	b := c.answer.b
	c.answerMu.Unlock()
	c.sendBytesTo(name, "node/"+c.cfg.Name, b)
}

// sendTo sends m to one member: as a packet when it fits one, else over
// TCP through the big queue under key. A packet, not a TCP stream: a
// request for a record is a few dozen bytes and is asked again while it
// goes unanswered, and so is the answer; a stream each ran 400 goroutines
// dialling in a 100-node cluster settling in one process (scaletest).
// Every release reads a packet's message as it reads a stream's.
func (c *Cluster) sendTo(name, key string, m message) {
	b, err := encode(m)
	if err != nil {
		c.log.Error("encode gossip message", "err", err)
		return
	}
	c.sendBytesTo(name, key, b)
}

// sendBytesTo is sendTo for a message encoded already.
func (c *Cluster) sendBytesTo(name, key string, b []byte) {
	var to *memberlist.Node
	for _, n := range c.ml.Members() {
		if n.Name == name {
			to = n
		}
	}
	if to == nil {
		return
	}
	if len(b) > c.bigThreshold {
		c.big.add(c, key, b, to)
		return
	}
	if err := c.ml.SendBestEffort(to, b); err == nil {
		c.sent.Add(1)
		c.traffic.outDirect.Add(uint64(len(b)))
	}
}
