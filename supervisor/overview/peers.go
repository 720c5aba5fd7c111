package overview

import (
	"context"
	"errors"
	"net"
	"os"
	"sort"
	"sync"

	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/status"
)

// maxPeers bounds how many peers one frame dials: node.json and the API
// are validated input, and a damaged one must not start thousands of
// connections every three seconds.
const maxPeers = 256

// PeersReader reads the peers: the members the agent knows when its API
// answers, else those remembered in node.json, each with a TCP check of
// its gossip port.
type PeersReader struct {
	API  API
	Addr string
	// Dial checks that addr accepts a TCP connection (DialTCP).
	Dial func(ctx context.Context, addr string) error
}

// PeersSection is what the Peers section shows.
type PeersSection struct {
	// FromAgent: the list is the agent's members, with their gossip
	// states. Otherwise it is node.json's remembered peers.
	FromAgent bool
	// Self is this node's name, as node.json or the agent says.
	Self  string
	Peers []Peer
	// Note replaces or follows the list (why it is the remembered one,
	// why there is none).
	Note      string
	NeedsRoot bool
}

// Peer is one other node.
type Peer struct {
	Name  string
	Addr  string
	State string
	// DialErr is why its gossip port did not accept a connection; empty
	// when it did.
	DialErr string
}

// Read reads the peers section.
func (r PeersReader) Read(ctx context.Context, d datadir.Dir, st stamp) PeersSection {
	var s PeersSection
	id, found, idErr := d.ReadIdentity()
	s.Self = id.Name
	if r.API != nil {
		var ci status.ClusterInfo
		// Half the bound for the agent, the rest for the dials.
		actx, cancel := part(ctx, 0.5)
		agentErr := r.API.Get(actx, apiAddr(r.Addr, st), "/v1/cluster", &ci)
		cancel()
		if agentErr == nil {
			s.FromAgent, s.Self = true, ci.Self
			for _, m := range ci.Members {
				if m.Name != ci.Self {
					s.Peers = append(s.Peers, Peer{Name: m.Name, Addr: m.Gossip, State: string(m.State)})
				}
			}
		}
	}
	if !s.FromAgent {
		switch {
		case errors.Is(idErr, os.ErrPermission):
			s.NeedsRoot, s.Note = true, "node.json is root's"
		case idErr != nil:
			s.Note = idErr.Error()
		case !found:
			s.Note = "no node.json: this node has not run here"
		default:
			s.Note = "the agent does not answer: the peers node.json remembers, without their gossip states"
			for _, p := range id.Peers {
				s.Peers = append(s.Peers, Peer{Addr: p})
			}
			if len(id.Peers) == 0 {
				s.Note = "the agent does not answer, and node.json remembers no peer"
			}
		}
	}
	sort.SliceStable(s.Peers, func(i, j int) bool { return s.Peers[i].Name+s.Peers[i].Addr < s.Peers[j].Name+s.Peers[j].Addr })
	if len(s.Peers) > maxPeers {
		s.Peers = s.Peers[:maxPeers]
	}
	dctx, cancel := part(ctx, 0.9)
	defer cancel()
	r.dialAll(dctx, s.Peers)
	return s
}

// dialAll checks every peer's gossip port at once.
func (r PeersReader) dialAll(ctx context.Context, peers []Peer) {
	dial := r.Dial
	if dial == nil {
		dial = DialTCP
	}
	var wg sync.WaitGroup
	for i := range peers {
		p := &peers[i]
		// An address from the API or node.json is input: only host:port
		// is dialled.
		if _, _, err := net.SplitHostPort(p.Addr); err != nil {
			p.DialErr = "not a host:port address"
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := dial(ctx, p.Addr); err != nil {
				p.DialErr = shortErr(err)
			}
		}()
	}
	wg.Wait()
}

// DialTCP opens and closes a TCP connection to addr.
func DialTCP(ctx context.Context, addr string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}
