package supervisor

import (
	"fmt"
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
	var mu sync.Mutex
	rates := map[string]float64{}
	cfg := h.config("a")
	cfg.GatewayAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cfg.GatewayRates = func() map[string]float64 {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]float64{}
		for d, r := range rates {
			out[d] = r
		}
		return out
	}
	h.cfgs["a"] = cfg
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
	mu.Lock()
	rates["chat"] = 23.456
	mu.Unlock()
	testwait.Until(t, 15*time.Second, "b sees a's rate for chat", func() (bool, string) {
		r := peerRates()
		return r["chat"] == 23, fmt.Sprint(r)
	})
	mu.Lock()
	delete(rates, "chat")
	rates["embed"] = 4
	mu.Unlock()
	testwait.Until(t, 15*time.Second, "b sees chat idle and embed at 4", func() (bool, string) {
		r := peerRates()
		_, chat := r["chat"]
		return !chat && r["embed"] == 4, fmt.Sprint(r)
	})
}
