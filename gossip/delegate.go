package gossip

import (
	"encoding/json"

	"github.com/hashicorp/memberlist"

	"github.com/llmgw/llmgw/internal/protocol"
)

// delegate adapts memberlist's Delegate callbacks to the cluster: node
// meta, messages in, broadcasts out, and push/pull of the whole state.
// memberlist calls it from its packet and stream goroutines, so no method
// blocks, and a buffer memberlist hands over is copied before it is kept.
// Until New has made the queue (ready), messages are ignored: push/pull
// brings them again.
type delegate struct{ c *Cluster }

var _ memberlist.Delegate = (*delegate)(nil)

// nodeMeta rides on memberlist's alive messages. Epoch is the node's boot
// epoch: it arrives with the very message that makes a restarted node alive
// again, before the new record does, so receivers can tell the old boot's
// record (and its claims) from the current one.
//
// Tok is the fingerprint of the cluster token (Config.TokenFingerprint),
// never the token.
//
// P is the range of protocol versions the node's build speaks
// (Config.Protocol): peers judge the cluster version by it, and refuse a
// node that cannot speak theirs before it becomes a member. Agents from
// before cluster versions send none, which reads as [1, 1]. V stays 1:
// they read it too.
type nodeMeta struct {
	V     int             `json:"v"`
	API   string          `json:"api,omitempty"`
	Epoch int64           `json:"epoch,omitempty"`
	Tok   string          `json:"tok,omitempty"`
	P     *protocol.Range `json:"p,omitempty"`
	// A is the version the node runs at (its ActiveVersion): a node that
	// joins a cluster already running a version it speaks adopts it at
	// once rather than waiting T to find out by itself (evaluateVersion).
	A int `json:"a,omitempty"`
}

func (d *delegate) NodeMeta(limit int) []byte {
	p := d.c.cfg.Protocol
	a := d.c.ActiveVersion()
	b, _ := json.Marshal(nodeMeta{V: 1, API: d.c.cfg.APIAddr, Epoch: d.c.epoch, Tok: d.c.cfg.TokenFingerprint, P: &p, A: a})
	if len(b) > limit {
		// memberlist panics on oversized meta; an API address never gets
		// close, but refuse to be the reason. The range stays: without it
		// the node would read as [1, 1], and be refused where the cluster
		// runs at a later version.
		b, _ = json.Marshal(nodeMeta{V: 1, P: &p, A: a})
	}
	return b
}

func (d *delegate) NotifyMsg(b []byte) {
	if !d.c.ready.Load() {
		return
	}
	d.c.heard()
	d.c.traffic.inGossip.Add(uint64(len(b)))
	h := d.c.seen.digest(b)
	if d.c.seen.has(h) {
		d.c.traffic.duplicates.Add(1)
		return
	}
	// memberlist reuses b after we return: copy before keeping anything.
	if d.c.receive(append([]byte(nil), b...), true) {
		d.c.seen.add(h)
	}
}

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	if !d.c.ready.Load() {
		return nil
	}
	out := d.c.queue.GetBroadcasts(overhead, limit)
	d.c.sent.Add(uint64(len(out)))
	for _, b := range out {
		d.c.traffic.outGossip.Add(uint64(len(b)))
	}
	return out
}

func (d *delegate) LocalState(join bool) []byte {
	b, err := encode(d.c.store.full())
	if err != nil {
		d.c.log.Error("encode full state", "err", err)
		return nil
	}
	d.c.traffic.outPushPull.Add(uint64(len(b)))
	return b
}

func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	if !d.c.ready.Load() {
		return
	}
	d.c.heard()
	d.c.traffic.inPushPull.Add(uint64(len(buf)))
	d.c.receive(append([]byte(nil), buf...), false)
}
