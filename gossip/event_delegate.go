package gossip

import (
	"encoding/json"

	"github.com/hashicorp/memberlist"
)

// eventDelegate tracks membership states. memberlist never calls it
// concurrently, so events keep their order.
type eventDelegate struct{ c *Cluster }

var _ memberlist.EventDelegate = (*eventDelegate)(nil)

func (e *eventDelegate) NotifyJoin(n *memberlist.Node)   { e.c.setMember(n, StateAlive) }
func (e *eventDelegate) NotifyUpdate(n *memberlist.Node) { e.c.setMember(n, StateAlive) }

// NotifyLeave cannot tell a leave from a death: n.State is stale in
// memberlist v0.7.0. Members() consults the node's record for that.
func (e *eventDelegate) NotifyLeave(n *memberlist.Node) { e.c.setMember(n, StateDead) }

// setMember records memberlist's verdict s on n, with the boot epoch,
// token fingerprint and protocol range its meta announces.
func (c *Cluster) setMember(n *memberlist.Node, s MemberState) {
	var meta nodeMeta
	_ = json.Unmarshal(n.Meta, &meta)
	c.mu.Lock()
	info, ok := c.members[n.Name]
	if !ok || info.state != s {
		prev := int64(0)
		if ok {
			prev = info.epoch
		}
		info = &memberInfo{state: s, addr: n.Address(), since: c.cfg.Clock.Now(), epoch: prev}
		c.members[n.Name] = info
	}
	info.addr = n.Address()
	info.proto, info.active = metaRange(meta), meta.A
	newToken := meta.Tok != info.token
	info.token = meta.Tok
	// An epoch beyond the bound would void every record the node sends
	// until the clocks caught up with it.
	_, epochErr := checkEpoch("memberlist meta of "+n.Name, meta.Epoch, c.cfg.Clock.Now())
	if meta.Epoch > info.epoch && epochErr == nil {
		info.epoch = meta.Epoch
	}
	c.mu.Unlock()
	if epochErr != nil {
		c.refuse(DropEpochAhead, "meta "+n.Name, epochErr)
	}
	if newToken && c.otherToken(meta.Tok) {
		// Gossip works (the key is another secret), but each node refuses
		// the other's API calls: say so on both sides, or the cluster
		// half-works with no one knowing why.
		c.log.Error("peer has a different cluster token: API calls between this node and it are refused; give every node the same --token-file",
			"peer", n.Name, "address", n.Address(), "peer_token_fingerprint", meta.Tok, "token_fingerprint", c.cfg.TokenFingerprint)
	}
	c.notify()
	c.pokeVersion()
}
