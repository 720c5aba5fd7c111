package publish

import (
	"maps"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
)

// record is an in-memory Record that counts its updates.
type record struct {
	r       gossip.NodeRecord
	updates int
}

func (r *record) Local() gossip.NodeRecord { return r.r }
func (r *record) UpdateLocal(fn func(*gossip.NodeRecord)) gossip.NodeRecord {
	fn(&r.r)
	r.updates++
	return r.r
}

// Shards go out at once when anything but their load changed, and for
// load alone at most every LoadInterval.
func TestLoadSpacesLoadOnlyChanges(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	rec := &record{}
	l := NewLoad(rec, nil, nil)
	shard := func(status gossip.ShardStatus, running float64) []gossip.ShardRecord {
		return []gossip.ShardRecord{{ShardID: "chat-0", Status: status, Load: gossip.ShardLoad{Running: running}}}
	}
	step := func(at time.Duration, s []gossip.ShardRecord, want bool) {
		t.Helper()
		if got := l.Publish(t0.Add(at), s); got != want {
			t.Fatalf("at %v: published %v, want %v", at, got, want)
		}
	}
	step(0, shard(gossip.ShardStarting, 0), true)
	step(time.Second, shard(gossip.ShardStarting, 0), false) // nothing new
	step(2*time.Second, shard(gossip.ShardReady, 0), true)   // a status: at once
	step(3*time.Second, shard(gossip.ShardReady, 5), false)  // load alone: spaced
	step(2*time.Second+LoadInterval, shard(gossip.ShardReady, 5), true)
	step(3*time.Second+LoadInterval, nil, true) // gone: at once
	if rec.updates != 4 || rec.r.Shards != nil {
		t.Fatalf("%d updates, shards %v; want 4 and none", rec.updates, rec.r.Shards)
	}
	if rec.r.GatewayRates != nil {
		t.Fatalf("a node without a gateway published rates %v", rec.r.GatewayRates)
	}
}

// The gateway's rates go out when they moved, rounded, at most every
// RatesInterval, and in the same update as shards that are due with them.
func TestLoadPublishesRatesWhenTheyMove(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	rec := &record{}
	rates := map[string]float64{}
	reads := 0
	l := NewLoad(rec, func() map[string]float64 {
		reads++
		out := map[string]float64{}
		for d, r := range rates {
			out[d] = r
		}
		return out
	}, nil)
	if !l.Publish(t0, nil) || rec.r.GatewayRates == nil || len(rec.r.GatewayRates) != 0 {
		t.Fatalf("first pass: rates %v, want idle and saying so", rec.r.GatewayRates)
	}
	rates["chat"] = 23.456
	if l.Publish(t0.Add(RatesInterval/2), nil) || reads != 1 {
		t.Fatalf("within the interval: published, or read the rates (%d reads)", reads)
	}
	s := []gossip.ShardRecord{{ShardID: "chat-0", Status: gossip.ShardReady}}
	if !l.Publish(t0.Add(RatesInterval), s) || rec.r.GatewayRates["chat"] != 23 || len(rec.r.Shards) != 1 || rec.updates != 2 {
		t.Fatalf("past it: rates %v, shards %v, %d updates; want chat at 23 with the shard, in one update", rec.r.GatewayRates, rec.r.Shards, rec.updates)
	}
	rates["chat"] = 25 // under a quarter: noise
	if l.Publish(t0.Add(3*RatesInterval), s) {
		t.Fatalf("a move under a quarter was published: %v", rec.r.GatewayRates)
	}
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

// The gateway's queue depths go out with the rates' spacing when a queue
// begins or empties or moves by a quarter (and by two), and leave the
// record when every queue is empty.
func TestLoadPublishesQueues(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	rec := &record{}
	queued := map[string]int{}
	l := NewLoad(rec, nil, func() map[string]int { return maps.Clone(queued) })
	if l.Publish(t0, nil) {
		t.Fatalf("no queue, nothing held: published %+v", rec.r)
	}
	queued["chat"] = 12
	if !l.Publish(t0.Add(RatesInterval), nil) || rec.r.GatewayQueued["chat"] != 12 {
		t.Fatalf("a queue began: %v", rec.r.GatewayQueued)
	}
	queued["chat"] = 30
	if l.Publish(t0.Add(RatesInterval+RatesInterval/2), nil) {
		t.Fatal("published within the interval")
	}
	if !l.Publish(t0.Add(2*RatesInterval), nil) || rec.r.GatewayQueued["chat"] != 30 {
		t.Fatalf("moved past a quarter: %v", rec.r.GatewayQueued)
	}
	queued["chat"] = 34 // under a quarter
	if l.Publish(t0.Add(3*RatesInterval), nil) {
		t.Fatalf("a move under a quarter was published: %v", rec.r.GatewayQueued)
	}
	delete(queued, "chat")
	if !l.Publish(t0.Add(4*RatesInterval), nil) || rec.r.GatewayQueued != nil {
		t.Fatalf("the queue emptied: %v, want the field gone", rec.r.GatewayQueued)
	}
}
