package supervisor

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/status"
)

// Two nodes with different tokens gossip, but each refuses the other's
// API calls; each shows the other as such in /v1/cluster.
func TestNodesWithAnotherTokenAreShown(t *testing.T) {
	h := newHarness(t)
	a := h.start("a")
	cfg := h.config("b", h.gossipAddr("a"))
	cfg.Token = "other-token-0123456789abcdef"
	h.cfgs["b"] = cfg
	b := h.start("b", h.gossipAddr("a"))
	for _, w := range []struct {
		n     *Node
		other string
	}{{a, "b"}, {b, "a"}} {
		testwait.Until(t, 10*time.Second, w.n.Name()+" shows "+w.other+"'s token differs", func() (bool, string) {
			var ci status.ClusterInfo
			call(t, "GET", api(w.n, "/v1/cluster"), "", nil, &ci)
			var desc []string
			ok := false
			for _, m := range ci.Members {
				desc = append(desc, fmt.Sprintf("%s:%v", m.Name, m.TokenMismatch))
				if m.Name == w.other {
					ok = m.TokenMismatch
				} else if m.TokenMismatch {
					return false, "itself flagged"
				}
			}
			return ok && w.n.GossipStats().TokenMismatches == 1, strings.Join(desc, " ")
		})
	}
}
