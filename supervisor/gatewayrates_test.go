package supervisor

import (
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/status"
)

// A node's gateway rates reach the other nodes' views through its record,
// rounded to two digits.
func TestGatewayRatesReachThePeers(t *testing.T) {
	h := newHarness(t)
	setRates := h.withGatewayRates("a")
	h.start("a")
	b := h.start("b", h.gossipAddr("a"))
	peerRates := func() map[string]float64 {
		var ci status.ClusterInfo
		call(t, "GET", api(b, "/v1/cluster"), "", nil, &ci)
		for _, m := range ci.Members {
			if m.Name == "a" {
				return m.GatewayRates
			}
		}
		return nil
	}
	setRates(map[string]float64{"chat": 23.456})
	testwait.Until(t, 15*time.Second, "b sees a's rate for chat", func() (bool, string) {
		r := peerRates()
		return r["chat"] == 23, fmt.Sprint(r)
	})
	setRates(map[string]float64{"embed": 4})
	testwait.Until(t, 15*time.Second, "b sees chat idle and embed at 4", func() (bool, string) {
		r := peerRates()
		_, chat := r["chat"]
		return !chat && r["embed"] == 4, fmt.Sprint(r)
	})
}

// withGatewayRates gives node name's config a gateway whose rates are
// what the returned function last set (none at first).
func (h *harness) withGatewayRates(name string) func(map[string]float64) {
	var mu sync.Mutex
	rates := map[string]float64{}
	cfg := h.config(name)
	cfg.GatewayAddr = fmt.Sprintf("127.0.0.1:%d", freePort(h.t))
	cfg.GatewayRates = func() map[string]float64 {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(rates)
	}
	h.cfgs[name] = cfg
	return func(r map[string]float64) {
		mu.Lock()
		defer mu.Unlock()
		rates = maps.Clone(r)
	}
}
