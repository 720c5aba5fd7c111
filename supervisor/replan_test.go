package supervisor

import (
	"fmt"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/testwait"
)

// A pass plans only when something placement reads changed: a peer's
// gateway rates (which travel in its record, like engine load and GPU
// telemetry) wake the other node's loop and are seen there, yet no plan is
// computed for them; a deployment placed, and a member leaving, are
// planned for.
func TestOnlyPlanInputsTriggerAPlan(t *testing.T) {
	h := newHarness(t)
	setRates := h.withGatewayRates("a")
	setRates(map[string]float64{"chat": 1})
	a := h.start("a")
	b := h.start("b", h.gossipAddr("a"))
	seesRate := func(want float64) (bool, string) {
		m, ok := b.Status().Member("a")
		return ok && len(m.GPUs) == 4 && m.GatewayRates["chat"] == want, fmt.Sprintf("%+v", m.GatewayRates)
	}
	testwait.Until(t, 15*time.Second, "b sees a with its GPUs and rate", func() (bool, string) { return seesRate(1) })
	passes0, computed0 := b.Status().Plans()
	if computed0 == 0 || passes0 < computed0 {
		t.Fatalf("b made %d passes and computed %d plans", passes0, computed0)
	}

	for i, r := range []float64{7, 42, 3} {
		setRates(map[string]float64{"chat": r})
		testwait.Until(t, 15*time.Second, fmt.Sprintf("b sees a's rate %v", r), func() (bool, string) { return seesRate(r) })
		passes, computed := b.Status().Plans()
		if passes <= passes0 {
			t.Fatalf("update %d: b made no pass for a's new record (%d passes)", i, passes)
		}
		if computed != computed0 {
			t.Fatalf("update %d: a rate change made b compute %d plans", i, computed-computed0)
		}
	}

	if code := call(t, "POST", api(b, "/v1/deployments"), testToken, []byte(`{"name":"chat","model":"m","engine":"fake"}`), nil); code != 200 {
		t.Fatalf("place: HTTP %d", code)
	}
	testwait.Until(t, 15*time.Second, "b plans the deployment", func() (bool, string) {
		_, computed := b.Status().Plans()
		return computed > computed0 && len(b.Status().Plan().Assignments) == 1, fmt.Sprint(computed, b.Status().Plan())
	})
	_, computed1 := b.Status().Plans()
	if err := a.Leave(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 15*time.Second, "b plans without a", func() (bool, string) {
		_, computed := b.Status().Plans()
		return computed > computed1, fmt.Sprint(computed)
	})
}

// With no event, the loop's next pass is due when a fresh lease lapses
// or the node's silence makes it isolated, whichever comes first; a
// member holding nothing, or whose lease lapsed already, sets no time.
func TestNextPassIsDueAtTheEarliestLapse(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &controlLoop{ttl: 3 * time.Second, isolation: &isolation{after: 10 * time.Second, started: t0.Add(-time.Minute)}}
	held := &gossip.NodeRecord{Shards: []gossip.ShardRecord{{ShardID: "chat-0"}}}
	members := []gossip.Member{
		{Name: "a", Record: held, SeenAt: t0.Add(-1 * time.Second)},
		{Name: "b", Record: held, SeenAt: t0.Add(-2 * time.Second)}, // lapses first: t0+1s
		{Name: "c", Record: &gossip.NodeRecord{}, SeenAt: t0.Add(-2900 * time.Millisecond)},
		{Name: "d", Record: held, SeenAt: t0.Add(-5 * time.Second)}, // lapsed already
	}
	if got, want := c.nextDue(t0, members, t0), t0.Add(time.Second+time.Millisecond); !got.Equal(want) {
		t.Errorf("due %v after t0, want %v", got.Sub(t0), want.Sub(t0))
	}
	// Heard last 9.5 s ago: isolated 0.5 s from now, before b's lapse.
	if got, want := c.nextDue(t0, members, t0.Add(-9500*time.Millisecond)), t0.Add(501*time.Millisecond); !got.Equal(want) {
		t.Errorf("due %v after t0, want %v", got.Sub(t0), want.Sub(t0))
	}
	if got := c.nextDue(t0, members[2:], t0); !got.Equal(t0.Add(10*time.Second + time.Millisecond)) {
		t.Errorf("with no fresh lease, due %v after t0, want the isolation's 10 s", got.Sub(t0))
	}
}
