package gossip

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
)

// Nodes with different cluster tokens gossip fine (the gossip key is
// another secret) but refuse each other's API calls: a half-working
// cluster. Each side says so, naming the other.
func TestTokenMismatchIsAnErrorOnBothSides(t *testing.T) {
	a := startNode(t, "a", 0, "", func(c *Config) { c.TokenFingerprint = "1111111111111111" })
	b := startNode(t, "b", 0, "", func(c *Config) { c.TokenFingerprint = "2222222222222222" })
	c := startNode(t, "c", 0, "", func(c *Config) { c.TokenFingerprint = "1111111111111111" })
	mustJoin(t, b, a)
	mustJoin(t, c, a)
	waitMembers(t, 3, a, b, c)
	// a and c share a token; b has another.
	for _, w := range []struct {
		n     *testNode
		other []string
	}{{a, []string{"b"}}, {b, []string{"a", "c"}}, {c, []string{"b"}}} {
		testwait.Until(t, 5*time.Second, fmt.Sprintf("%s reports the token of %v", w.n.cfg.Name, w.other), func() (bool, string) {
			l := w.n.log.String()
			var flagged []string
			for _, m := range w.n.Members() {
				if m.TokenMismatch {
					flagged = append(flagged, m.Name)
				}
			}
			logged := strings.Contains(l, "level=ERROR")
			for _, p := range w.other {
				logged = logged && strings.Contains(l, "different cluster token") && strings.Contains(l, "peer="+p)
			}
			return logged && fmt.Sprint(flagged) == fmt.Sprint(w.other) && w.n.Stats().TokenMismatches == len(w.other),
				fmt.Sprintf("flagged %v, logged %v", flagged, logged)
		})
	}
	if l := a.log.String(); strings.Contains(l, "peer=c ") {
		t.Errorf("a reported c, which has the same token:\n%s", l)
	}
}
