package gossip

import (
	"encoding/binary"
	"time"

	"github.com/hashicorp/memberlist"
)

// pingDelegate puts this node's wall time into every ack and takes the
// peers' from theirs.
type pingDelegate struct{ c *Cluster }

var _ memberlist.PingDelegate = (*pingDelegate)(nil)

func (p *pingDelegate) AckPayload() []byte {
	b := make([]byte, 9)
	b[0] = clockPayloadV1
	binary.BigEndian.PutUint64(b[1:], uint64(p.c.cfg.Clock.Now().UnixNano()))
	return b
}

func (p *pingDelegate) NotifyPingComplete(other *memberlist.Node, rtt time.Duration, payload []byte) {
	if !p.c.ready.Load() || other == nil || other.Name == p.c.cfg.Name {
		return
	}
	p.c.heard()
	p.c.sampleClock(other.Name, rtt, payload)
}
