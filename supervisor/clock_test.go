package supervisor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// A node whose clock is beyond the bound refuses a place itself, with an
// error that says why, instead of its stamp being refused by every peer;
// every node's /v1/cluster shows the offset.
func TestPlaceOnANodeWithAWrongClockIsRefusedThere(t *testing.T) {
	skew := gossip.MaxClockOffset + 15*time.Second
	h := newHarness(t)
	a := h.start("a")
	h.start("b", h.gossipAddr("a"))
	cfg := h.config("c", h.gossipAddr("a"))
	cfg.Clock = clock.Offset(clock.Real(), func() time.Duration { return skew })
	h.cfgs["c"] = cfg
	c := h.start("c", h.gossipAddr("a"))
	testwait.Until(t, 15*time.Second, "a's /v1/cluster shows c's clock off and its own right", func() (bool, string) {
		var ci status.ClusterInfo
		call(t, "GET", api(a, "/v1/cluster"), "", nil, &ci)
		var desc []string
		ok := 0
		for _, m := range ci.Members {
			if m.ClockOffset == nil {
				desc = append(desc, m.Name+"=?")
				continue
			}
			desc = append(desc, fmt.Sprintf("%s=%v", m.Name, *m.ClockOffset))
			want := time.Duration(0)
			if m.Name == "c" {
				want = skew
			}
			if d := *m.ClockOffset - want; d > -time.Second && d < time.Second {
				ok++
			}
		}
		return ok == 3, strings.Join(desc, " ")
	})
	testwait.Until(t, 10*time.Second, "c knows its own clock is off", func() (bool, string) {
		off, n := c.Cluster().ClockOffset()
		return n == 2 && off > gossip.MaxClockOffset, fmt.Sprint(off, n)
	})
	spec := placement.Deployment{Name: "chat", Model: "m", Engine: "fake", Replicas: 1}
	_, err := c.Place(context.Background(), spec)
	if !errors.Is(err, gossip.ErrClockOutOfBounds) || !strings.Contains(err.Error(), "clock") {
		t.Fatalf("place on c: %v, want a refusal naming the clock", err)
	}
	if code := call(t, "POST", api(c, "/v1/deployments"), testToken, []byte(`{"name":"chat","model":"m","engine":"fake"}`), nil); code/100 == 2 {
		t.Fatalf("POST /v1/deployments on c: HTTP %d, want a refusal", code)
	}
	if _, ok := c.Cluster().Deployment("chat"); ok {
		t.Fatal("the refused place is in c's store")
	}
	if _, err := a.Place(context.Background(), spec); err != nil {
		t.Fatalf("place on a, whose clock is right: %v", err)
	}
}
