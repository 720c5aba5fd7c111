package gossip

import (
	"fmt"
	"net"
	"sort"
	"time"

	"github.com/hashicorp/memberlist"
)

// dropTransport wraps memberlist's network transport and silently drops
// every packet and stream to a peer the drop function names. Both sides of a
// simulated partition install the rule, so dropping outgoing traffic is
// enough to cut the link both ways. TEST ONLY.
type dropTransport struct {
	*memberlist.NetTransport
	drop func(peer string) bool
}

var _ memberlist.NodeAwareTransport = (*dropTransport)(nil)

func newDropTransport(mc *memberlist.Config, drop func(string) bool) (*dropTransport, error) {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{mc.BindAddr},
		BindPort:  mc.BindPort,
		Logger:    mc.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("drop transport: %w", err)
	}
	if mc.BindPort == 0 {
		mc.BindPort = nt.GetAutoBindPort()
		if mc.AdvertisePort == 0 {
			mc.AdvertisePort = mc.BindPort
		}
	}
	return &dropTransport{NetTransport: nt, drop: drop}, nil
}

func (t *dropTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if a.Name != "" && t.drop(a.Name) {
		return time.Now(), nil
	}
	return t.NetTransport.WriteTo(b, a.Addr)
}

func (t *dropTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if a.Name != "" && t.drop(a.Name) {
		return nil, fmt.Errorf("partitioned from %s (test drop rule)", a.Name)
	}
	return t.NetTransport.DialTimeout(a.Addr, timeout)
}

func sortMembers(ms []Member) {
	sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
}
