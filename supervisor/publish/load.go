package publish

import (
	"math"
	"reflect"
	"strconv"
	"time"

	"github.com/llmgw/llmgw/gossip"
)

// Load publishes the part of the record that follows the work: the shards
// this node holds, with their engines' load, and its gateway's request
// rates. The control loop owns it.
type Load struct {
	record Record
	// rates reads the gateway's requests/s per deployment lately; nil
	// when this node runs no gateway, and the record then says nothing
	// of rates.
	rates func() map[string]float64
	// queued reads the requests the gateway's queue holds per deployment
	// now (demand the engines do not see yet); nil: none here.
	queued func() map[string]int
	// shardsAt and ratesAt are when each last went out.
	shardsAt, ratesAt time.Time
}

// NewLoad publishes into record; rates and queued are the gateway's (nil:
// none here).
func NewLoad(record Record, rates func() map[string]float64, queued func() map[string]int) *Load {
	return &Load{record: record, rates: rates, queued: queued}
}

// Publish puts shards, and the gateway's rates, in the record when each is
// due, in one update (every update sends the whole record and wakes every
// node's control loop). It reports whether the record changed.
func (l *Load) Publish(now time.Time, shards []gossip.ShardRecord) bool {
	local := l.record.Local()
	shardsDue := l.shardsDue(now, local.Shards, shards)
	rates, ratesDue := l.ratesDue(now, local.GatewayRates)
	queued, queuedDue := l.queuedDue(now, local.GatewayQueued)
	if !shardsDue && !ratesDue && !queuedDue {
		return false
	}
	if ratesDue || queuedDue {
		l.ratesAt = now
	}
	l.record.UpdateLocal(func(r *gossip.NodeRecord) {
		if shardsDue {
			r.Shards = shards
		}
		if ratesDue {
			r.GatewayRates = rates
		}
		if queuedDue {
			r.GatewayQueued = queued
		}
	})
	return true
}

// queuedDue returns the gateway's queue depths when the record, which
// holds old, should carry them anew: a queue began or emptied, or a depth
// moved by a quarter and by at least two, at most every RatesInterval
// (with the rates). A queue is demand the engines' load does not show
// yet, and the deciders read it as such.
func (l *Load) queuedDue(now time.Time, old map[string]int) (map[string]int, bool) {
	if l.queued == nil || now.Sub(l.ratesAt) < RatesInterval {
		return nil, false
	}
	cur := l.queued()
	if !queuedMoved(old, cur) {
		return nil, false
	}
	if len(cur) == 0 {
		return nil, true // no queue: the field leaves the record
	}
	return cur, true
}

func queuedMoved(old, cur map[string]int) bool {
	if len(old) != len(cur) {
		return true
	}
	for d, c := range cur {
		o, ok := old[d]
		diff := max(c-o, o-c)
		if !ok || (diff >= 2 && diff*4 > max(c, o)) {
			return true
		}
	}
	return false
}

// shardsDue says whether the record, which holds old, must be republished
// with the shards cur: always when anything but load changed, and for
// load alone at most every LoadInterval. It notes the time of a
// publication it allows.
func (l *Load) shardsDue(now time.Time, old, cur []gossip.ShardRecord) bool {
	if reflect.DeepEqual(cur, old) {
		return false
	}
	if len(cur) == len(old) {
		same := true
		for i := range cur {
			a, b := cur[i], old[i]
			a.Load, b.Load = gossip.ShardLoad{}, gossip.ShardLoad{}
			if !reflect.DeepEqual(a, b) {
				same = false
				break
			}
		}
		if same && now.Sub(l.shardsAt) < LoadInterval {
			return false
		}
	}
	l.shardsAt = now
	return true
}

// ratesDue returns the gateway's rates when the record, which holds old,
// should carry them anew: a deployment started or stopped seeing traffic
// here, or a rate moved by a quarter and by at least one request a second,
// at most every RatesInterval. Steady traffic leaves the record as it is;
// the other gateways need the rates' proportions, not their digits, which
// are rounded to two.
func (l *Load) ratesDue(now time.Time, old map[string]float64) (map[string]float64, bool) {
	if l.rates == nil || now.Sub(l.ratesAt) < RatesInterval {
		return nil, false
	}
	cur := l.rates()
	if !ratesMoved(old, cur) {
		return nil, false
	}
	out := make(map[string]float64, len(cur))
	for d, r := range cur {
		out[d] = twoDigits(r)
	}
	return out, true
}

func ratesMoved(old, cur map[string]float64) bool {
	if old == nil || len(old) != len(cur) {
		return true
	}
	for d, c := range cur {
		o, ok := old[d]
		if !ok {
			return true
		}
		if diff := math.Abs(c - o); diff >= 1 && diff > max(c, o)/4 {
			return true
		}
	}
	return false
}

// twoDigits rounds x to two significant digits, through their decimal
// form so that the record says 7.8, not 7.800000000000001.
func twoDigits(x float64) float64 {
	if x <= 0 || math.IsInf(x, 0) || math.IsNaN(x) {
		return 0
	}
	r, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'g', 2, 64), 64)
	return r
}
