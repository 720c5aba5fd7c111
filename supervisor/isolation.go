package supervisor

import (
	"log/slog"
	"sync"
	"time"

	"github.com/llmgw/llmgw/gossip"
)

// isolation judges whether this node hears its peers. The control loop
// judges it at every pass (check); the API reads the verdict (since).
type isolation struct {
	self    string
	ttl     time.Duration
	started time.Time
	// after is how long a node that expects peers may hear none before it
	// is isolated (isolatedAfter).
	after time.Duration
	// toldPeers: --join or node.json named peers at start.
	toldPeers bool
	// shards is what this node holds, named in the isolation line.
	shards interface{ Shards() []gossip.ShardRecord }
	log    *slog.Logger

	mu sync.Mutex
	// isolatedSince is since when the node has heard none (zero: it is
	// not isolated).
	isolatedSince time.Time
}

// isolatedAfter is how long a node that expects peers may hear none before
// it says it is isolated: several probe intervals (each one an ack from
// some peer when any is reachable), and never less than 2 s, so a loaded
// machine's late ack is not an outage.
func isolatedAfter(p gossip.Profile) time.Duration {
	return max(5*p.ProbeInterval(), 2*time.Second)
}

// expectsPeers: this node was told of peers (--join, or remembered ones)
// or has met a member that did not leave on purpose. A node that starts a
// cluster alone, or whose peers all left, is alone, not isolated.
func (i *isolation) expectsPeers(members []gossip.Member) bool {
	for _, m := range members {
		if m.Name != i.self && m.State != gossip.StateLeft {
			return true
		}
	}
	met := false
	for _, m := range members {
		met = met || m.Name != i.self
	}
	return !met && i.toldPeers
}

// check judges, at now, whether this node, which last heard a peer at
// heard (zero: never), hears any, and says so on a change: one error line
// when it becomes isolated (its shards' leases lapse in the other nodes'
// views within the TTL, and they may start them elsewhere), one info line
// at the first contact after. It returns since when the node is isolated
// (zero: it is not).
func (i *isolation) check(now, heard time.Time, members []gossip.Member) time.Time {
	heard, after := i.silence(heard)
	silent := now.Sub(heard)
	i.mu.Lock()
	was := i.isolatedSince
	isolated := i.expectsPeers(members) && silent >= after
	switch {
	case isolated && was.IsZero():
		i.isolatedSince = heard
	case !isolated:
		i.isolatedSince = time.Time{}
	}
	since := i.isolatedSince
	i.mu.Unlock()
	switch {
	case isolated && was.IsZero():
		i.log.Error("this node is isolated: it has heard no peer for "+silent.Round(100*time.Millisecond).String()+
			"; its shards' leases will lapse in the other nodes' views within the lease TTL and those shards may be started elsewhere; check this host's network to its peers (gossip port, UDP and TCP)",
			"last_heard", heard.UTC().Format(time.RFC3339), "lease_ttl", i.ttl, "shards_held", len(i.shards.Shards()))
	case !isolated && !was.IsZero():
		i.log.Info("this node hears its peers again: no longer isolated", "isolated_for", now.Sub(was).Round(100*time.Millisecond).String())
	}
	return since
}

// silence is since when the node counts its silence, given when it last
// heard a peer, and how long that silence may last before it is isolated.
func (i *isolation) silence(heard time.Time) (time.Time, time.Duration) {
	if heard.IsZero() || heard.Before(i.started) {
		// Never heard anyone: peers may just be starting (nodes start in
		// any order), and the join loop says what it hears meanwhile;
		// isolated once the node stops waiting and settles on its own.
		return i.started, max(i.after, settleTimeout)
	}
	return heard, i.after
}

// due is when the silence since heard makes the node isolated, if it
// expects peers by then (check says whether it does).
func (i *isolation) due(heard time.Time) time.Time {
	since, after := i.silence(heard)
	return since.Add(after + time.Millisecond)
}

// since is since when this node has heard no peer while it expects some
// (zero: it is not isolated).
func (i *isolation) since() time.Time {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.isolatedSince
}
