package supervisor

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
)

// A pass plans only when something placement reads changed: a peer's
// gateway rates (which travel in its record, like engine load and GPU
// telemetry) wake the other node's loop and are seen there, yet no plan is
// computed for them; a deployment placed, and a member leaving, are
// planned for.
func TestOnlyPlanInputsTriggerAPlan(t *testing.T) {
	h := newHarness(t)
	var mu sync.Mutex
	rate := 1.0
	cfg := h.config("a")
	cfg.GatewayAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cfg.GatewayRates = func() map[string]float64 {
		mu.Lock()
		defer mu.Unlock()
		return map[string]float64{"chat": rate}
	}
	h.cfgs["a"] = cfg
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
		mu.Lock()
		rate = r
		mu.Unlock()
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
