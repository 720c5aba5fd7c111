package gossip

import (
	"encoding/json"

	"github.com/hashicorp/memberlist"
)

// aliveDelegate keeps out of membership a peer whose announced protocol
// range cannot speak this node's active version: memberlist ignores an
// alive message the delegate refuses, so the peer never becomes a member
// here (and is not relayed onward by this node). It is still shown, as
// refused (Members).
type aliveDelegate struct{ c *Cluster }

var _ memberlist.AliveDelegate = (*aliveDelegate)(nil)

func (a *aliveDelegate) NotifyAlive(n *memberlist.Node) error {
	c := a.c
	if n.Name == c.cfg.Name {
		return nil
	}
	var meta nodeMeta
	_ = json.Unmarshal(n.Meta, &meta)
	r, active := metaRange(meta), c.ActiveVersion()
	if r.Speaks(active) {
		c.admitPeer(n.Name, meta.Epoch)
		return nil
	}
	return c.refusePeer(n.Name, n.Address(), r, meta.Epoch, active)
}
