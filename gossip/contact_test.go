package gossip

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
)

// The joining side of a wrong-key join learns which peer answered and
// that the keys differ, from memberlist's own error on real sockets, so
// the node can say so instead of "no peer answered".
func TestWrongKeyJoinSaysWhichPeerRefusedIt(t *testing.T) {
	a := startNode(t, "a", 0, "", func(c *Config) { c.Key = bytes.Repeat([]byte{1}, 32) })
	for _, tc := range []struct {
		name string
		key  []byte
	}{{"other key", bytes.Repeat([]byte{2}, 32)}, {"no key", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			x := startNode(t, "x-"+strings.ReplaceAll(tc.name, " ", "-"), 0, "", func(c *Config) { c.Key = tc.key })
			_, err := x.Join([]string{a.Address()})
			var je *JoinError
			if !errors.As(err, &je) || !errors.Is(err, ErrKeyMismatch) {
				t.Fatalf("join error %v (%T): want a JoinError wrapping ErrKeyMismatch", err, err)
			}
			if je.Peer != a.Address() {
				t.Fatalf("peer %q, want %q (err %v)", je.Peer, a.Address(), err)
			}
			if !x.LastHeard().IsZero() {
				t.Fatalf("a peer it cannot read counts as heard: %v", x.LastHeard())
			}
		})
	}
}

func TestNobodyAnsweringIsNotAKeyMismatch(t *testing.T) {
	a := startNode(t, "a", 0, "", nil)
	b := startNode(t, "b", 0, "", nil)
	addr := b.Address()
	_ = b.Shutdown()
	_, err := a.Join([]string{addr})
	if err == nil || errors.Is(err, ErrKeyMismatch) {
		t.Fatalf("join of a stopped peer: %v; want an error that is not ErrKeyMismatch", err)
	}
}

func TestLastHeardAdvancesWhilePeersTalk(t *testing.T) {
	a := startNode(t, "a", 0, "", nil)
	if !a.LastHeard().IsZero() {
		t.Fatal("a lone node has heard someone")
	}
	b := startNode(t, "b", 0, "", nil)
	if _, err := b.Join([]string{a.Address()}); err != nil {
		t.Fatal(err)
	}
	first := time.Time{}
	testwait.Until(t, 5*time.Second, "a hears b", func() (bool, string) {
		first = a.LastHeard()
		return !first.IsZero(), "never heard"
	})
	testwait.Until(t, 5*time.Second, "a keeps hearing b", func() (bool, string) {
		return a.LastHeard().After(first), a.LastHeard().String()
	})
}
