package gossip

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/internal/protocol"
)

// The cluster version, on the model of CockroachDB's: every build speaks a
// range of protocol versions (internal/protocol) and announces it in its
// node meta; a node runs at its active version, the highest version that
// every member it counts speaks, and every rule that changes what another
// node computes is chosen by it. Unlike CockroachDB's, nobody bumps it by
// hand: each node raises its own once no member that speaks less has been
// seen for VersionSettle, and it never goes down. A peer that cannot speak
// it is refused (alive_delegate.go) rather than half understood.

// Defaults of Config.VersionSettle and Config.VersionDeadAfter.
const (
	// DefaultVersionSettle (T) is how long no member with a lower Max may
	// have been seen before a version becomes active. 30 s is more than the
	// handover period (a few seconds: supervisor's max(1 s, SpreadBound))
	// and one push/pull interval of the lan profile (30 s), the period in
	// which every node exchanges its whole state with some peer: by then a
	// member that one node knows of has reached the others, so nodes do not
	// raise the version while one of them still sees an older member.
	DefaultVersionSettle = 30 * time.Second
	// DefaultVersionDeadAfter (D) is how long a dead member still counts:
	// a node that crashed during an upgrade is most likely coming back with
	// the binary it had, and it must find the cluster still speaking it.
	DefaultVersionDeadAfter = 10 * time.Minute
)

// versionEvery is how often the rule is judged besides membership changes:
// that is when T and D elapse. One pass is O(members), with no allocation
// and no store lookup for a live member: about 10 µs over 500 members
// (BenchmarkEvaluateVersion500), held under c.mu.
const versionEvery = time.Second

// maxRefusedPeers bounds the refused peers remembered: names come from
// peers. Forgetting them all only means they are logged again.
const maxRefusedPeers = 1024

// versions is one node's cluster-version bookkeeping. The Cluster owns it;
// the fields after evalMu are under Cluster.mu, because they are judged
// together with the members they describe.
type versions struct {
	own      protocol.Range
	settle   time.Duration // T
	deadFor  time.Duration // D
	onActive func(int)

	// active is read without locks: every rule that a version gates reads
	// it on its hot path.
	active atomic.Int64
	// expectPeers: this node was told of peers (ExpectPeers). Until it has
	// heard one it does not know what they speak, so nothing rises.
	expectPeers atomic.Bool
	// poke asks the version loop for a pass now (a membership change).
	poke chan struct{}
	// evalMu makes passes one at a time, so that rises are logged and
	// reported to onActive in the order they happened.
	evalMu sync.Mutex

	// lowerSeen[v] is the last moment a counted member whose Max is below
	// v was seen (v in (active, own.Max]); v may become active settle
	// after it. It starts at New: until then nothing was seen at all.
	lowerSeen []time.Time
	// mixedSince is since when live members announce different Max (zero:
	// they all announce this node's).
	mixedSince time.Time
	// refused holds the peers whose announced range cannot speak the
	// active version: memberlist keeps them out, their records are
	// dropped, and Members shows them.
	refused map[string]*refusal
}

// refusal is one refused peer, as its last alive message announced it.
type refusal struct {
	r      protocol.Range
	epoch  int64
	addr   string
	since  time.Time // first refused in this boot of the peer
	latest time.Time // last refused: refusals older than D are forgotten
}

// init sets up the bookkeeping from cfg (defaults already applied)
// at now, New's moment.
func (v *versions) init(cfg Config, now time.Time) {
	v.own, v.settle, v.deadFor, v.onActive = cfg.Protocol, cfg.VersionSettle, cfg.VersionDeadAfter, cfg.OnActiveVersion
	v.active.Store(int64(max(cfg.ActiveVersion, cfg.Protocol.Min)))
	v.poke = make(chan struct{}, 1)
	v.lowerSeen = make([]time.Time, cfg.Protocol.Max+1)
	for i := range v.lowerSeen {
		v.lowerSeen[i] = now
	}
	v.refused = map[string]*refusal{}
}

// versionConfig applies the version defaults to cfg and checks it.
func versionConfig(cfg *Config) error {
	if cfg.Protocol == (protocol.Range{}) {
		cfg.Protocol = protocol.Build()
	}
	if !cfg.Protocol.Valid() {
		return fmt.Errorf("gossip: Config.Protocol %d-%d: want 1 <= Min <= Max", cfg.Protocol.Min, cfg.Protocol.Max)
	}
	if cfg.ActiveVersion > cfg.Protocol.Max {
		return fmt.Errorf("gossip: Config.ActiveVersion %d is beyond this build's protocol versions %d-%d: the cluster runs a newer release; run that release or a later one on this node",
			cfg.ActiveVersion, cfg.Protocol.Min, cfg.Protocol.Max)
	}
	if cfg.VersionSettle <= 0 {
		cfg.VersionSettle = DefaultVersionSettle
	}
	if cfg.VersionDeadAfter <= 0 {
		cfg.VersionDeadAfter = DefaultVersionDeadAfter
	}
	return nil
}

// ActiveVersion is the cluster protocol version this node runs at: every
// rule that changes what another node computes follows it. It never goes
// down.
func (c *Cluster) ActiveVersion() int { return int(c.ver.active.Load()) }

// Protocol is the range of versions this node speaks and announces.
func (c *Cluster) Protocol() protocol.Range { return c.ver.own }

// VersionsMixedSince is since when live members announce different
// protocol versions (by their Max); zero while they all speak the same.
func (c *Cluster) VersionsMixedSince() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ver.mixedSince
}

// ExpectPeers tells the node it was told of peers (--join, or peers it
// remembers): until it has heard one, its active version does not rise. A
// node restarted into a partition knows nothing of the members it cannot
// reach, and raising the version alone would refuse them once it heals.
func (c *Cluster) ExpectPeers() { c.ver.expectPeers.Store(true) }

// metaRange is the range a peer's meta announces: none (an agent from
// before cluster versions) is [1, 1].
func metaRange(m nodeMeta) protocol.Range {
	if m.P == nil {
		return protocol.Range{Min: protocol.V1, Max: protocol.V1}
	}
	return *m.P
}

// pokeVersion asks for a pass of the rule now, without blocking.
func (c *Cluster) pokeVersion() {
	select {
	case c.ver.poke <- struct{}{}:
	default:
	}
}

// versionLoop judges the rule on every membership change and every
// versionEvery, on the cluster's clock, so that T and D elapse under a
// fake one in tests.
func (c *Cluster) versionLoop() { c.every(versionEvery, c.ver.poke, c.evaluateVersion) }

// noteVersionSeen records until when member name (info, as this node
// knows it) was counted with its range: for every version above the active
// one that it cannot speak, a lower member was seen then. A member is
// counted while memberlist holds it alive or suspect, until D after its
// death when it died, and not at all once it left. A range that changed
// between two passes (an old build restarted as a new one) was seen until
// the earlier pass: the rise comes at most versionEvery early, against a T
// of 30 s. The caller (evaluateVersion) skips refused members and those
// that cannot speak active. Under c.mu.
func (c *Cluster) noteVersionSeen(name string, info *memberInfo, active int, now time.Time) {
	v := &c.ver
	if info.proto.Max >= v.own.Max {
		return // speaks all this node could rise to
	}
	first := max(active+1, info.proto.Max+1)
	until := now
	if info.state == StateDead {
		until = info.since.Add(v.deadFor)
		if until.After(now) {
			until = now
		}
		if !until.After(v.lowerSeen[first]) {
			return // already counted: a long-dead member costs no lookup
		}
		// memberlist v0.7.0 cannot tell a leave from a death in its
		// events (see NotifyLeave): the node's record says it left.
		if ns, ok := c.store.Node(name); ok && ns.Record.Leaving {
			return
		}
	}
	for l := first; l <= v.own.Max; l++ {
		if until.After(v.lowerSeen[l]) {
			v.lowerSeen[l] = until
		}
	}
}

// evaluateVersion judges the rule once: the active version rises to the
// highest v that no counted member has been below for T. It also keeps
// mixedSince, and forgets refusals older than D.
func (c *Cluster) evaluateVersion() {
	v := &c.ver
	v.evalMu.Lock()
	defer v.evalMu.Unlock()
	now := c.cfg.Clock.Now()
	heardNone := v.expectPeers.Load() && c.lastHeard.Load() == 0

	c.mu.Lock()
	active := int(v.active.Load())
	mixed := false
	// adopt is the highest version a live member runs at that this node
	// speaks (see below).
	adopt := 0
	for name, info := range c.members {
		if name == c.cfg.Name {
			continue
		}
		if _, refused := v.refused[name]; refused {
			continue
		}
		live := info.state != StateDead // memberInfo holds alive or dead
		if live && info.active > adopt && v.own.Speaks(info.active) {
			adopt = info.active
		}
		if !info.proto.Speaks(active) {
			continue
		}
		if live && info.proto.Max != v.own.Max {
			mixed = true
		}
		c.noteVersionSeen(name, info, active, now)
	}
	if heardNone {
		for l := range v.lowerSeen {
			v.lowerSeen[l] = now
		}
	}
	next := active
	for l := active + 1; l <= v.own.Max && now.Sub(v.lowerSeen[l]) >= v.settle; l++ {
		next = l
	}
	// A live member already running a higher version that this node
	// speaks has judged the rule for the cluster (it refuses whoever
	// cannot speak it): adopt it, as a CockroachDB node joining a cluster
	// takes the cluster's version. A node that joins a cluster of its own
	// release then runs its rules at once instead of T later.
	if !heardNone && adopt > next {
		next = adopt
	}
	if next > active {
		v.active.Store(int64(next))
	}
	switch {
	case mixed && v.mixedSince.IsZero():
		v.mixedSince = now
	case !mixed:
		v.mixedSince = time.Time{}
	}
	for name, r := range v.refused {
		if now.Sub(r.latest) > v.deadFor {
			delete(v.refused, name)
		}
	}
	c.mu.Unlock()

	if next > active {
		c.log.Info("cluster protocol version raised: every member speaks it", "active_version", next, "was", active,
			"protocol", fmt.Sprintf("%d-%d", v.own.Min, v.own.Max))
		if v.onActive != nil {
			v.onActive(next)
		}
		// Announce it (node meta carries it) to the nodes that join next.
		if err := c.ml.UpdateNode(time.Second); err != nil {
			c.log.Warn("the raised cluster version is not announced in this node's meta yet", "err", err)
		}
	}
}

// checkPeerProtocol refuses what a peer sends when its announced range
// cannot speak the active version: its node records and beats are not
// merged (receive.go). A node whose meta this node has not seen passes: its
// meta arrives with the alive message that makes it a member.
func (c *Cluster) checkPeerProtocol(name string) (DropReason, error) {
	active := c.ActiveVersion()
	c.mu.Lock()
	defer c.mu.Unlock()
	r, refused := protocol.Range{}, false
	if rf, ok := c.ver.refused[name]; ok {
		r, refused = rf.r, true
	} else if info, ok := c.members[name]; ok && !info.proto.Speaks(active) {
		r, refused = info.proto, true
	}
	if !refused {
		return "", nil
	}
	return DropProtocolRefused, fmt.Errorf("%w: node %s speaks protocol versions %d-%d, not the cluster's active version %d",
		ErrInvalidRecord, name, r.Min, r.Max, active)
}

// refusePeer notes that peer name, announcing r with boot epoch epoch at
// addr, cannot speak the active version, and logs it once per boot of the
// peer. It reports the error memberlist logs with its refusal.
func (c *Cluster) refusePeer(name, addr string, r protocol.Range, epoch int64, active int) error {
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	rf, ok := c.ver.refused[name]
	first := !ok || rf.epoch != epoch
	if first {
		if !ok && len(c.ver.refused) >= maxRefusedPeers {
			c.ver.refused = map[string]*refusal{}
		}
		rf = &refusal{since: now}
		c.ver.refused[name] = rf
	}
	rf.r, rf.epoch, rf.addr, rf.latest = r, epoch, addr, now
	c.mu.Unlock()
	err := fmt.Errorf("node %s speaks protocol versions %d-%d and the cluster runs at version %d", name, r.Min, r.Max, active)
	if first {
		c.log.Error("refused a peer that cannot speak the cluster's protocol version: upgrade it to a release that speaks the active version (llmgw version prints a build's range); a cluster version never goes down",
			"peer", name, "address", addr, "peer_protocol", fmt.Sprintf("%d-%d", r.Min, r.Max), "active_version", active)
		c.notify()
	}
	return err
}

// admitPeer forgets a refusal of name once an alive message of the same
// boot or a later one announces a range that speaks the active version (it
// was upgraded). An older boot's message that arrives late does not.
func (c *Cluster) admitPeer(name string, epoch int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rf, ok := c.ver.refused[name]; ok && epoch >= rf.epoch {
		delete(c.ver.refused, name)
	}
}

// markRefused shows m as refused when this node refuses it: its last alive
// message announced a range that cannot speak the active version, or
// memberlist admitted it, alive, with such a range just before the version
// rose. A dead member stays dead: it is refused if it comes back. Under
// c.mu.
func (c *Cluster) markRefused(m *Member, active int) {
	if m.Name == c.cfg.Name {
		return
	}
	if rf, ok := c.ver.refused[m.Name]; ok {
		m.State, m.Protocol, m.Since = StateRefused, rf.r, rf.since
		if m.Address == "" {
			m.Address = rf.addr
		}
		return
	}
	if (m.State == StateAlive || m.State == StateSuspect) && m.Protocol != (protocol.Range{}) && !m.Protocol.Speaks(active) {
		m.State = StateRefused
	}
}
