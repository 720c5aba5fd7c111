package gossip

import (
	"encoding/json"
	"fmt"
	"time"
)

// receive merges a message from a peer. rebroadcast is true for packets
// that arrived as gossip, which are passed on when they taught us something
// (that is how a broadcast reaches nodes its origin never picked).
func (c *Cluster) receive(b []byte, rebroadcast bool) (clean bool) {
	m, err := decode(b)
	if err != nil {
		c.dropped.Add(1)
		c.drops[DropMalformed].Add(1)
		c.log.Warn("dropped gossip message", "err", err)
		return false
	}
	clean = len(m.bad) == 0
	c.received.Add(1)
	c.traffic.nodes.Add(uint64(len(m.Nodes)))
	c.traffic.beats.Add(uint64(len(m.Beats)))
	c.traffic.deployments.Add(uint64(len(m.Deployments)))
	// Every record is checked on its own: one bad record is refused and
	// counted, and the rest of the message (a push/pull carries the whole
	// state) is still taken. That holds for a record that did not even
	// decode, too.
	for _, bad := range m.bad {
		c.refuse(DropMalformedRecord, bad.what, fmt.Errorf("%w: %w", ErrMalformed, bad.err))
	}
	now := c.cfg.Clock.Now()
	changed := false
	// refused names the node records of this message that were refused:
	// the beat that a push/pull sends beside a record (Store.full) must not
	// then ask its owner for it.
	var refused map[string]bool
	for i, n := range m.Nodes {
		if n.Name == c.cfg.Name {
			continue // our own record: we are its only writer
		}
		reason, err := checkNode(n, now)
		if err == nil {
			// A peer that cannot speak the active version (version.go).
			reason, err = c.checkPeerProtocol(n.Name)
		}
		if err != nil {
			c.refuse(reason, "node "+n.Name, err)
			clean = false
			if refused == nil {
				refused = map[string]bool{}
			}
			refused[n.Name] = true
			continue
		}
		// The bytes the record came in are what it is kept and relayed
		// in, unknown fields and all.
		raw := rawAt(m.nodeRaw, i)
		if c.store.mergeNode(n, raw) {
			changed = true
			if rebroadcast {
				c.relay("node/"+n.Name, message{Nodes: []NodeRecord{n}, nodeRaw: []json.RawMessage{raw}})
			}
		}
	}
	for _, bt := range m.Beats {
		if bt.Name == c.cfg.Name {
			continue
		}
		reason, err := checkBeat(bt, now)
		if err == nil {
			reason, err = c.checkPeerProtocol(bt.Name)
		}
		if err != nil {
			c.refuse(reason, "beat "+bt.Name, err)
			clean = false
			continue
		}
		if ok, since := c.store.mergeBeat(bt); ok {
			// A renewal of a record renewed lately changes no lease
			// judged with a longer TTL: it wakes nobody, so the
			// renewals of a large cluster (150 a second at 500 nodes)
			// do not each cost every node a pass. One that ends a
			// silence does.
			if since >= c.cfg.BeatQuiet {
				changed = true
			}
			// A beat its origin sent itself went to every member
			// (beatToAll); one that came another way (from an older
			// release, or in a push/pull) is gossip, passed on.
			if rebroadcast && m.From != bt.Name {
				c.relay("beat/"+bt.Name, message{Beats: []Beat{bt}})
			}
		} else if !refused[bt.Name] && c.store.Lacks(bt) {
			c.want(bt)
			clean = false // the same beat, once the record is here, is news
		}
	}
	for _, w := range m.Wants {
		if w == c.cfg.Name && m.From != "" {
			c.sendLocalTo(m.From)
		}
	}
	for _, r := range m.Renews {
		if r == c.cfg.Name && m.From != "" {
			c.sendBeatTo(m.From)
		}
	}
	if len(m.Wants) > 0 || len(m.Renews) > 0 {
		// A request asked again (its answer was lost) comes in the same
		// bytes: it must not be dropped as a copy (dedup.go).
		clean = false
	}
	depChanged := false
	for i, d := range m.Deployments {
		if reason, err := checkDeployment(d, now); err != nil {
			c.refuse(reason, "deployment "+d.Name, err)
			clean = false
			continue
		}
		c.hlc.Witness(d.Stamp)
		e := depEntry{rec: d, raw: rawAt(m.depRaw, i)}
		if c.store.mergeDeployment(e) {
			depChanged = true
			if rebroadcast {
				c.relay("dep/"+d.Name, e.message())
			}
		}
	}
	if depChanged {
		select {
		case c.persist <- struct{}{}:
		default:
		}
	}
	if changed || depChanged {
		c.notify()
	}
	return clean
}

// want asks a beat's sender for the record content we lack, once per
// content version.
func (c *Cluster) want(b Beat) {
	c.ask(b.Name, b.Content, message{From: c.cfg.Name, Wants: []string{b.Name}})
}

// ask sends request m to node name, unless name was asked about content
// less than wantRetry ago.
func (c *Cluster) ask(name string, content Version, m message) {
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	if c.wanted == nil {
		c.wanted = map[string]wantedAt{}
	}
	if w := c.wanted[name]; w.content == content && now.Sub(w.at) < wantRetry {
		c.mu.Unlock()
		return
	}
	c.wanted[name] = wantedAt{content: content, at: now}
	c.mu.Unlock()
	c.sendTo(name, "wants/"+name, m)
}

// sendBeatTo sends this node's newest beat to one member, which asked
// (Renews). A beat for content the asker lacks makes it want the record,
// as any beat does.
func (c *Cluster) sendBeatTo(name string) {
	c.mu.Lock()
	b := Beat{Name: c.cfg.Name, Version: c.local.Version, Content: c.content}
	c.mu.Unlock()
	c.sendTo(name, "renew/"+name, message{Beats: []Beat{b}, From: c.cfg.Name})
}

// staleLoop runs askStale every BeatQuiet/2.
func (c *Cluster) staleLoop() { c.every(c.cfg.BeatQuiet/2, nil, c.askStale) }

// askStale asks every live member whose record was last renewed more than
// BeatQuiet ago for its newest beat (Renews). A beat travels as one packet
// (beatToAll), every TTL/3; a lost one would leave that member's leases
// judged here from the renewal before, and three in a row would lapse
// them here alone. The answer is a beat, a hundred bytes, not the record,
// kilobytes deflated anew for each asker (in a 100-node cluster settling
// in one process, records sent to askers were a tenth of the CPU). It
// renews the record only when its version is newer than the one held: a
// member that stopped renewing (its loop stalled) answers with the version
// it last renewed at, which changes nothing, so its leases lapse as they
// should. A record silent for twice BeatQuiet (the node's lease TTL) is
// not asked for any more: its leases lapsed here already, and asking every
// few seconds would cost a stalled member an answer to every node. Each
// round is a lookup per member, every few seconds.
func (c *Cluster) askStale() {
	now := c.cfg.Clock.Now()
	cut := now.Add(-c.cfg.BeatQuiet)
	for _, n := range c.ml.Members() {
		if n.Name == c.cfg.Name {
			continue
		}
		if content, stale := c.store.renewedBefore(n.Name, cut, now.Add(-2*c.cfg.BeatQuiet)); stale {
			c.ask(n.Name, content, message{From: c.cfg.Name, Renews: []string{n.Name}})
		}
	}
}

// wantRetry is how long a request for a missing record waits for its
// answer before it is asked again.
const wantRetry = 2 * time.Second

type wantedAt struct {
	content Version
	at      time.Time
}

// refuse counts a refused record under reason and logs why. The log line
// for one record is written at most once a minute: a bad record that a
// peer holds arrives again with every push/pull, and the count says how
// often.
func (c *Cluster) refuse(reason DropReason, record string, err error, attrs ...any) {
	c.drops[reason].Add(1)
	if c.logNow(string(reason) + "/" + record) {
		c.log.Warn("refused gossip record", append([]any{"reason", reason, "record", record, "err", err}, attrs...)...)
	}
}

// logNow reports whether the line keyed key is due: not logged within
// refusalLogEvery.
func (c *Cluster) logNow(key string) bool {
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refusedAt == nil || len(c.refusedAt) >= maxRefusalsLogged {
		// Bounded: names come from peers. Forgetting them all only means
		// a few lines are logged again.
		c.refusedAt = map[string]time.Time{}
	}
	if last, seen := c.refusedAt[key]; seen && now.Sub(last) < refusalLogEvery {
		return false
	}
	c.refusedAt[key] = now
	return true
}

const (
	refusalLogEvery   = time.Minute
	maxRefusalsLogged = 1024
)
