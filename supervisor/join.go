package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/supervisor/datadir"
)

// joinLoop joins the given peers, retrying with exponential backoff until
// one answers, so nodes can start in any order. Later, it keeps dialling
// members it believes dead: after a partition heals memberlist alone would
// stop talking to the other side once its gossip-to-the-dead window passed.
func (n *Node) joinLoop(ctx context.Context, peers []string) {
	defer n.wg.Done()
	peers = dedupe(peers, n.cluster.Address())
	backoff := 250 * time.Millisecond
	warned, keySaid := false, false
	if len(peers) == 0 {
		n.settle("no peers to join: this node starts the cluster")
	}
	giveUp := n.clock.Now().Add(settleTimeout)
	for len(peers) > 0 {
		num, err := n.cluster.Join(peers)
		if err == nil {
			n.log.Info("joined cluster", "contacted", num, "members", n.cluster.NumMembers())
			n.settle("joined")
			break
		}
		refused := n.keyMismatch(err, &keySaid)
		if n.clock.Now().After(giveUp) {
			why := "no peer answered within " + settleTimeout.String()
			if refused {
				why = "no peer accepted this node's gossip key within " + settleTimeout.String()
			}
			n.settle(why + "; acting on what this node knows")
		}
		if !warned && !refused {
			n.log.Warn("--join: no peer answered yet; retrying in the background", "peers", peers, "err", err)
			warned = true
		}
		if !clock.Sleep(ctx, n.clock, backoff) {
			return
		}
		backoff = min(backoff*2, 30*time.Second)
	}
	tick := time.NewTicker(n.reconnectInterval())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// Dead members are dialled at once, not one after another: each
		// unanswered dial takes memberlist's TCP timeout, and a stop waits
		// for this loop.
		var wg sync.WaitGroup
		for _, m := range n.cluster.Members() {
			if m.State != gossip.StateDead || m.Address == "" || n.clock.Now().Sub(m.Since) > reconnectFor {
				continue
			}
			wg.Go(func() {
				if ctx.Err() != nil {
					return
				}
				// name/addr: memberlist then knows whom it dials, and a
				// node it would refuse (a partition rule) is not dialled.
				if _, err := n.cluster.Join([]string{m.Name + "/" + m.Address}); err == nil {
					n.log.Info("reconnected to a member believed dead", "member", m.Name)
				}
			})
		}
		wg.Wait()
		n.rememberPeers()
	}
}

// reconnectFor bounds how long a dead member is dialled again: long enough
// for a partition to heal or a machine to be repaired (Serf's reconnect
// timeout is the same day), not forever for a node that was retired.
const reconnectFor = 24 * time.Hour

// settleTimeout bounds how long a node that cannot reach any peer waits
// before it starts and stops engines on its own view.
const settleTimeout = 10 * time.Second

// settle lets the engines act on the plan. Until the node has exchanged
// state with a peer its view is partial (after a restart it may not even
// know the other nodes), and a plan from a partial view would start
// duplicates of shards that run elsewhere.
func (n *Node) settle(why string) {
	if s, ok := n.runner.(settler); ok {
		if n.settled.CompareAndSwap(false, true) {
			n.log.Info("engines may now follow the plan", "why", why)
			s.Settle()
			n.wakeLoop()
		}
	}
}

// wakeLoop makes the control loop reconcile now rather than at its next
// tick or event.
func (n *Node) wakeLoop() {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

func (n *Node) reconnectInterval() time.Duration {
	if n.cfg.Profile.Name == "local" {
		return time.Second
	}
	return 10 * time.Second
}

// ValidateJoin checks a --join value without contacting it.
func ValidateJoin(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return fmt.Errorf("--join %q: want host:port, e.g. 10.0.0.2:7946", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("--join %q: port must be 1-65535", addr)
	}
	// A name that does not resolve is a typo, not a peer that is still
	// booting: fail now. An address that resolves but does not answer is
	// retried in the background.
	if net.ParseIP(host) == nil {
		if _, err := net.LookupHost(host); err != nil {
			return fmt.Errorf("--join %q: host does not resolve: %v", addr, err)
		}
	}
	return nil
}

func dedupe(peers []string, self string) []string {
	seen := map[string]bool{self: true}
	var out []string
	for _, p := range peers {
		if p = strings.TrimSpace(p); p != "" && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// loadIdentity reads node.json, checks the name, and bumps the boot epoch
// so this run's records are newer than any the cluster still holds from the
// last run, even if the clock went backwards in between.
//
// A stored epoch beyond gossip.MaxClockOffset of now (the node once booted
// with its clock far ahead) starts over at now, with a log line: peers
// refuse epochs that far ahead, so they never took a record of it, and
// bumping it would keep the node out until the clocks caught up.
func loadIdentity(dir datadir.Dir, name string, now func() time.Time, log *slog.Logger) (datadir.Identity, error) {
	id, found, err := dir.ReadIdentity()
	switch {
	case errors.Is(err, datadir.ErrCorrupt):
		return id, fmt.Errorf("--data-dir: %v; move it aside to start as a new node", err)
	case err != nil:
		return id, fmt.Errorf("--data-dir: %w", err)
	case found && id.Name != "" && id.Name != name:
		return id, fmt.Errorf("--name %q: the data dir %s belongs to node %q; use that name or another --data-dir", name, dir.Root(), id.Name)
	}
	id.Name = name
	t := now()
	if limit := t.Add(gossip.MaxClockOffset).UnixNano(); id.Epoch > limit {
		log.Warn("the stored boot epoch lies in the future (this node once booted with its clock ahead); starting over at now, as peers refuse an epoch that far ahead",
			"stored_epoch", time.Unix(0, id.Epoch).UTC().Format(time.RFC3339), "now", t.UTC().Format(time.RFC3339), "bound", gossip.MaxClockOffset, "file", dir.NodeFile())
		id.Epoch = 0
	}
	id.Epoch = max(id.Epoch+1, t.UnixNano())
	if err := dir.WriteIdentity(id); err != nil {
		return id, fmt.Errorf("--data-dir: %w", err)
	}
	return id, nil
}

// rememberPeers saves the gossip addresses of live members, so a restart
// finds the cluster without --join.
func (n *Node) rememberPeers() {
	var peers []string
	for _, m := range n.cluster.Members() {
		if m.Name != n.cfg.Name && m.State == gossip.StateAlive && m.Address != "" {
			peers = append(peers, m.Address)
		}
	}
	// Only the join loop calls this, so n.id needs no lock.
	if len(peers) == 0 || slices.Equal(n.id.Peers, peers) {
		return
	}
	n.id.Peers = peers
	if err := n.dir.WriteIdentity(n.id); err != nil {
		n.log.Warn("remember peers", "err", err)
	}
}
