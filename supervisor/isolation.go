package supervisor

import (
	"errors"
	"time"

	"github.com/llmgw/llmgw/gossip"
)

// isolatedAfter is how long a node that expects peers may hear none before
// it says it is isolated: several probe intervals (each one an ack from
// some peer when any is reachable), and never less than 2 s, so a loaded
// machine's late ack is not an outage.
func (n *Node) isolatedAfter() time.Duration {
	return max(5*n.cfg.Profile.ProbeInterval(), 2*time.Second)
}

// expectsPeers: this node was told of peers (--join, or remembered ones)
// or has met a member that did not leave on purpose. A node that starts a
// cluster alone, or whose peers all left, is alone, not isolated.
func (n *Node) expectsPeers(members []gossip.Member) bool {
	for _, m := range members {
		if m.Name != n.cfg.Name && m.State != gossip.StateLeft {
			return true
		}
	}
	met := false
	for _, m := range members {
		met = met || m.Name != n.cfg.Name
	}
	return !met && n.toldPeers
}

// checkIsolation judges, once per control-loop pass, whether this node
// hears any peer, and says so on a change: one error line when it becomes
// isolated (its shards' leases lapse in the other nodes' views within the
// TTL, and they may start them elsewhere), one info line at the first
// contact after. It returns since when the node is isolated (zero: it is
// not).
func (n *Node) checkIsolation(now time.Time, members []gossip.Member) time.Time {
	heard := n.cluster.LastHeard()
	after := n.isolatedAfter()
	if heard.IsZero() || heard.Before(n.started) {
		// Never heard anyone: peers may just be starting (nodes start in
		// any order), and the join loop says what it hears meanwhile;
		// isolated once the node stops waiting and settles on its own.
		heard, after = n.started, max(after, settleTimeout)
	}
	silent := now.Sub(heard)
	n.mu.Lock()
	was := n.isolatedSince
	isolated := n.expectsPeers(members) && silent >= after
	switch {
	case isolated && was.IsZero():
		n.isolatedSince = heard
	case !isolated:
		n.isolatedSince = time.Time{}
	}
	since := n.isolatedSince
	n.mu.Unlock()
	switch {
	case isolated && was.IsZero():
		n.log.Error("this node is isolated: it has heard no peer for "+silent.Round(100*time.Millisecond).String()+
			"; its shards' leases will lapse in the other nodes' views within the lease TTL and those shards may be started elsewhere; check this host's network to its peers (gossip port, UDP and TCP)",
			"last_heard", heard.UTC().Format(time.RFC3339), "lease_ttl", n.cfg.LeaseTTL, "shards_held", len(n.runner.Shards()))
	case !isolated && !was.IsZero():
		n.log.Info("this node hears its peers again: no longer isolated", "isolated_for", now.Sub(was).Round(100*time.Millisecond).String())
	}
	return since
}

// Isolated is since when this node has heard no peer while it expects
// some (zero: it is not isolated).
func (n *Node) Isolated() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.isolatedSince
}

// keyMismatch says, once per join loop, that a peer answered but refused
// this node's gossip key, and what to do: otherwise the node would only
// say that no peer answered, and retry for ever.
func (n *Node) keyMismatch(err error, said *bool) bool {
	var je *gossip.JoinError
	if !errors.As(err, &je) || !errors.Is(err, gossip.ErrKeyMismatch) {
		return false
	}
	if !*said {
		*said = true
		n.log.Error("peer "+je.Peer+" answered but gossip decryption failed: this node's gossip key differs from the cluster's; copy "+
			n.dir.GossipKeyFile()+" from a member (gossip.key in its data dir) or pass the cluster's key with --gossip-key-file (if this node already names a file there, that file holds the wrong key), then restart this node",
			"peer", je.Peer, "detail", je.Detail)
	}
	return true
}
