package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
)

// joiner joins this node to the cluster and keeps it joined: it retries
// the peers it was told of until one answers, settles the runner, and then
// keeps dialling members it believes dead. It owns the node's identity
// (the peers it remembers) once Start has loaded it.
type joiner struct {
	cluster *gossip.Cluster
	runner  Runner
	id      *identity
	// keyFile is where this node's gossip key lives, named when a peer
	// refuses it.
	keyFile   string
	self      string
	reconnect time.Duration
	clock     clock.Clock
	log       *slog.Logger
	// wake makes the control loop pass now (the node settled).
	wake wakeup
	// settled: the node has heard the cluster (or stopped waiting to).
	// The control loop reads it at every pass, for the snapshot's
	// Settled, which the gateway waits for.
	settled atomic.Bool
}

// run joins the given peers, retrying with exponential backoff until one
// answers, so nodes can start in any order. Later, it keeps dialling
// members it believes dead: after a partition heals memberlist alone would
// stop talking to the other side once its gossip-to-the-dead window passed.
func (j *joiner) run(ctx context.Context, peers []string) {
	peers = dedupe(peers, j.cluster.Address())
	backoff := 250 * time.Millisecond
	warned, keySaid := false, false
	if len(peers) == 0 {
		j.settle("no peers to join: this node starts the cluster")
	}
	giveUp := j.clock.Now().Add(settleTimeout)
	for len(peers) > 0 {
		num, err := j.cluster.Join(peers)
		if err == nil {
			j.log.Info("joined cluster", "contacted", num, "members", j.cluster.NumMembers())
			j.settle("joined")
			break
		}
		refused := j.keyMismatch(err, &keySaid)
		if j.clock.Now().After(giveUp) {
			why := "no peer answered within " + settleTimeout.String()
			if refused {
				why = "no peer accepted this node's gossip key within " + settleTimeout.String()
			}
			j.settle(why + "; acting on what this node knows")
		}
		if !warned && !refused {
			j.log.Warn("--join: no peer answered yet; retrying in the background", "peers", peers, "err", err)
			warned = true
		}
		if !clock.Sleep(ctx, j.clock, backoff) {
			return
		}
		backoff = min(backoff*2, 30*time.Second)
	}
	tick := j.clock.NewTicker(j.reconnect)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.Chan():
		}
		// Dead members are dialled at once, not one after another: each
		// unanswered dial takes memberlist's TCP timeout, and a stop waits
		// for this loop.
		var wg sync.WaitGroup
		for _, m := range j.cluster.Members() {
			if m.State != gossip.StateDead || m.Address == "" || j.clock.Since(m.Since) > reconnectFor {
				continue
			}
			wg.Go(func() {
				if ctx.Err() != nil {
					return
				}
				// name/addr: memberlist then knows whom it dials, and a
				// node it would refuse (a partition rule) is not dialled.
				if _, err := j.cluster.Join([]string{m.Name + "/" + m.Address}); err == nil {
					j.log.Info("reconnected to a member believed dead", "member", m.Name)
				}
			})
		}
		wg.Wait()
		j.id.rememberPeers(j.self, j.cluster.Members())
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
//
// The node settles whatever its runner: the gateway waits for it too, and
// a runner that claims without running (--runtime none) has no Settle.
func (j *joiner) settle(why string) {
	if !j.settled.CompareAndSwap(false, true) {
		return
	}
	j.log.Info("engines may now follow the plan", "why", why)
	if s, ok := j.runner.(settler); ok {
		s.Settle()
	}
	j.wake.poke()
}

// keyMismatch says, once per join loop, that a peer answered but refused
// this node's gossip key, and what to do: otherwise the node would only
// say that no peer answered, and retry for ever.
func (j *joiner) keyMismatch(err error, said *bool) bool {
	var je *gossip.JoinError
	if !errors.As(err, &je) || !errors.Is(err, gossip.ErrKeyMismatch) {
		return false
	}
	if !*said {
		*said = true
		j.log.Error("peer "+je.Peer+" answered but gossip decryption failed: this node's gossip key differs from the cluster's; copy "+
			j.keyFile+" from a member (gossip.key in its data dir) or pass the cluster's key with --gossip-key-file (if this node already names a file there, that file holds the wrong key), then restart this node",
			"peer", je.Peer, "detail", je.Detail)
	}
	return true
}

// reconnectInterval is how often members believed dead are dialled.
func reconnectInterval(p gossip.Profile) time.Duration {
	if p.Name == "local" {
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
