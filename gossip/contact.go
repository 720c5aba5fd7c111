package gossip

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// heard notes that something from a peer arrived and was understood: an
// ack to this node's probe, a message, or a push/pull. A node that hears
// nothing for several probe intervals is cut off, whatever memberlist's
// suspicion timers still say about its peers (see LastHeard).
func (c *Cluster) heard() { c.lastHeard.Store(c.cfg.Clock.Now().UnixNano()) }

// LastHeard is when this node last heard a peer (zero: never). Packets that
// could not be decrypted do not count: a peer with another gossip key is not
// a peer.
func (c *Cluster) LastHeard() time.Time {
	ns := c.lastHeard.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// ProbeInterval is how often memberlist probes a peer under this profile:
// a node with any reachable peer hears an ack at least that often.
func (p Profile) ProbeInterval() time.Duration { return p.base().ProbeInterval }

// ErrKeyMismatch is wrapped by a JoinError when a peer answered but the two
// nodes could not read each other's gossip: their gossip keys differ (or one
// of them runs without encryption).
var ErrKeyMismatch = errors.New("gossip keys differ")

// JoinError is why a join failed. Peer, when set, is a peer that answered
// and refused this node's key.
type JoinError struct {
	Addrs  []string
	Peer   string
	Detail string
	err    error
}

func (e *JoinError) Error() string {
	if e.Peer != "" {
		return fmt.Sprintf("join %v: peer %s answered but gossip decryption failed (%s)", e.Addrs, e.Peer, e.Detail)
	}
	return fmt.Sprintf("join %v: %v", e.Addrs, e.err)
}

func (e *JoinError) Unwrap() []error {
	if e.Peer != "" {
		return []error{ErrKeyMismatch, e.err}
	}
	return []error{e.err}
}

// keyMismatchTexts are memberlist v0.7.0's own words (net.go readStream,
// security.go decryptPayload) on the joining side of a push/pull whose peer
// uses another key: the peer cannot read the join and answers with an error
// message encrypted with its own key, which this node cannot read either.
// When only one side encrypts, the error says so instead.
var keyMismatchTexts = []string{
	"no installed keys could decrypt the message",
	"encryption is configured but remote state is not encrypted",
	"remote state is encrypted and encryption is not configured",
}

// joinError classifies memberlist's join error: its multierror lists one
// "failed to join ADDR: REASON" per address.
func joinError(addrs []string, err error) *JoinError {
	je := &JoinError{Addrs: addrs, err: err}
	for _, line := range strings.Split(err.Error(), "\n") {
		lower := strings.ToLower(line)
		for _, t := range keyMismatchTexts {
			if !strings.Contains(lower, t) {
				continue
			}
			je.Detail = t
			if _, rest, ok := strings.Cut(line, "failed to join "); ok {
				je.Peer, _, _ = strings.Cut(rest, ": ")
			}
			if je.Peer == "" {
				je.Peer = strings.Join(addrs, ",")
			}
			return je
		}
	}
	return je
}
