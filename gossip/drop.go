package gossip

import (
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/memberlist"
)

// dropTransport wraps the node's transport and silently drops every
// packet and stream to a peer the drop function names. Both sides of a
// simulated partition install the rule, so dropping outgoing traffic is
// enough to cut the link both ways. TEST ONLY.
type dropTransport struct {
	*transport
	drop func(peer string) bool
	// nameOf names the node at a gossip address, for sends that carry no
	// name (a Join by address).
	nameOf func(addr string) string
}

func (t *dropTransport) dropped(a memberlist.Address) bool {
	name := a.Name
	if name == "" && t.nameOf != nil {
		name = t.nameOf(a.Addr)
	}
	return name != "" && t.drop(name)
}

var _ memberlist.NodeAwareTransport = (*dropTransport)(nil)

func (t *dropTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.dropped(a) {
		// real time: memberlist times its probes against this stamp with
		// its own time.Now, as the transport's WriteTo does.
		return time.Now(), nil
	}
	return t.transport.WriteToAddress(b, a)
}

func (t *dropTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.dropped(a) {
		return nil, fmt.Errorf("partitioned from %s (test drop rule)", a.Addr)
	}
	return t.transport.DialAddressTimeout(a, timeout)
}
