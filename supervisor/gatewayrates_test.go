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

// Rates go out again only when they move by a quarter (and by one
// request a second): steady traffic must not resend the record.
func TestRatesMovedIgnoresNoise(t *testing.T) {
	cases := []struct {
		old, cur map[string]float64
		want     bool
	}{
		{nil, map[string]float64{}, true}, // first word: idle
		{map[string]float64{}, map[string]float64{}, false},
		{map[string]float64{"chat": 20}, map[string]float64{"chat": 23}, false},
		{map[string]float64{"chat": 20}, map[string]float64{"chat": 30}, true},
		{map[string]float64{"chat": 0.4}, map[string]float64{"chat": 1.2}, false}, // under a request a second
		{map[string]float64{"chat": 20}, map[string]float64{}, true},              // stopped
		{map[string]float64{"chat": 20}, map[string]float64{"chat": 20, "embed": 1}, true},
		{map[string]float64{"chat": 20}, map[string]float64{"embed": 20}, true},
	}
	for _, c := range cases {
		if got := ratesMoved(c.old, c.cur); got != c.want {
			t.Errorf("%v -> %v: moved %v, want %v", c.old, c.cur, got, c.want)
		}
	}
	for x, want := range map[float64]float64{23.456: 23, 0.0456: 0.046, 1234: 1200, 0: 0, -1: 0} {
		if got := twoDigits(x); got < want*0.9999 || got > want*1.0001 {
			t.Errorf("twoDigits(%v) = %v, want %v", x, got, want)
		}
	}
	// The record carries the decimal as written: 7.8, as the demo's
	// /v1/cluster once showed 7.800000000000001.
	if got := twoDigits(7.7777); got != 7.8 {
		t.Errorf("twoDigits(7.7777) = %v, want exactly 7.8", got)
	}
}
