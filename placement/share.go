package placement

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// GPU sharing by demand (cluster protocol 6, View.Share).
//
// A few machines and many models: the models nobody uses should give their
// GPUs to the models somebody does. When a deployment with demand (any
// deployment but an idle autoscaled one) has shards that do not fit,
// replicas of idle autoscaled deployments above their min give their GPUs
// up, in this order:
//
//	lowest priority first (Deployment.Priority),
//	then least recently used (Usage.LastRequest, a minute),
//	then by name, then the highest replica index first.
//
// Never a deployment that is not idle (it serves or is asked for), never
// a replica below its deployment's min: those are not candidates at all.
//
// The choice is part of Compute, so pure and the same on every node: it
// reads only the view, and idleness arrives quantised, as each autoscaled
// deployment's decider published it (Usage). It works by trying: the
// shards with demand are placed in views where the first k candidates'
// shards are gone (as are shards already on their way out, which free
// their GPUs anyway), for the least k that places as many of them as
// removing every candidate would. Of those k, the replicas evicted are
// the ones whose GPUs the trial gave to a shard with demand; a candidate
// freed for nothing keeps running.
//
// An evicted replica is neither kept nor placed: its holder stops it, and
// its GPUs stay reserved until its record drops it (reserveHeld), so the
// shard with demand is placed one pass later, where the GPUs are free. In
// every pass a replica that yields is placed only after every other
// (placeAll), so it cannot take back what it gave.
//
// A trial is a whole Compute without sharing; there are at most
// 2 + log2(candidates) of them, and only in a pass where something with
// demand does not fit and some idle replica holds GPUs.

// yields says whether replica r gives its GPUs up to demand: sharing is
// on, its deployment autoscales and is idle, and r is above its min.
func (p *planner) yields(r *replicaState) bool {
	a := r.dep.d.Autoscale
	return p.usage != nil && a != nil && p.usage[r.dep.d.Name].Idle && r.index >= a.Min
}

// evictable is a replica sharing may stop: it yields and holds GPUs.
type evictable struct {
	rep  *replicaState
	held []holder // its kept shards
}

// share returns plan (p's) with the replicas GPU sharing evicts, if any.
func share(v View, p *planner, plan Plan) Plan {
	// Shards with demand that did not fit.
	needy := map[string]string{} // shard ID → spec version
	for _, u := range plan.Unplaced {
		s := p.shards[u.ShardID]
		if s == nil || (s.rep.dep.d.Autoscale != nil && p.usage[s.rep.dep.d.Name].Idle) {
			continue // invalid, or idle: no demand
		}
		needy[s.id] = s.rep.dep.version
	}
	var cands []evictable
	for _, d := range p.deps {
		for _, r := range d.replicas {
			if !p.yields(r) {
				continue
			}
			e := evictable{rep: r}
			for _, s := range r.shards {
				if s.kept.ok() {
					e.held = append(e.held, s.kept)
				}
			}
			if len(e.held) > 0 {
				cands = append(cands, e)
			}
		}
	}
	if len(needy) == 0 || len(cands) == 0 {
		return plan
	}
	slices.SortFunc(cands, func(a, b evictable) int {
		da, db := a.rep.dep, b.rep.dep
		return cmp.Or(
			cmp.Compare(da.d.Priority, db.d.Priority),
			cmp.Compare(p.usage[da.d.Name].LastRequest, p.usage[db.d.Name].LastRequest),
			strings.Compare(da.d.Name, db.d.Name),
			cmp.Compare(b.rep.index, a.rep.index),
		)
	})

	// Held shards the plan keeps nowhere are on their way out: their GPUs
	// free up without anyone's eviction.
	kept := map[heldKey]bool{}
	for _, a := range plan.Assignments {
		kept[heldKey{a.Node, a.ShardID, a.SpecVersion}] = true
	}
	trial := func(k int) Plan {
		gone := map[heldKey]bool{}
		for _, e := range cands[:k] {
			for _, h := range e.held {
				gone[heldKey{h.node.name, h.held.ShardID, h.held.SpecVersion}] = true
			}
		}
		tv := View{Deployments: v.Deployments, Share: true, Usage: v.Usage, Nodes: make([]Node, len(v.Nodes))}
		for i, n := range v.Nodes {
			tv.Nodes[i] = n
			tv.Nodes[i].Shards = slices.DeleteFunc(slices.Clone(n.Shards), func(h HeldShard) bool {
				key := heldKey{n.Name, h.ShardID, h.SpecVersion}
				return gone[key] || !kept[key]
			})
		}
		return newPlanner(tv, nil).plan()
	}
	placed := func(tp Plan) (n int) {
		for _, a := range tp.Assignments {
			if needy[a.ShardID] == a.SpecVersion && !a.Kept {
				n++
			}
		}
		return n
	}
	best := placed(trial(len(cands)))
	if best == 0 || placed(trial(0)) == best {
		return plan // nothing to gain, or the GPUs on their way out suffice
	}
	// The least k that places as many (k = len(cands) places best).
	lo, hi := 1, len(cands)
	for lo < hi {
		mid := lo + (hi-lo)/2
		if placed(trial(mid)) >= best {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	tp := trial(lo)
	// GPUs the trial gave to shards with demand, and to which.
	taken := map[nodeGPU]string{}
	for _, a := range tp.Assignments {
		if needy[a.ShardID] == a.SpecVersion && !a.Kept {
			for _, g := range a.GPUs {
				taken[nodeGPU{a.Node, g}] = a.Deployment
			}
		}
	}
	evicted := map[string]string{}
	waitsFor := map[string][]string{} // deployment with demand → replicas stopping for it
	for _, e := range cands[:lo] {
		var to []string
		for _, h := range e.held {
			for _, g := range h.held.GPUs {
				if d, ok := taken[nodeGPU{h.node.name, g}]; ok && !slices.Contains(to, d) {
					to = append(to, d)
				}
			}
		}
		if len(to) == 0 {
			continue // freed in the trial for nothing: it keeps running
		}
		slices.Sort(to)
		d := e.rep.dep
		evicted[e.rep.id] = fmt.Sprintf(EvictionPrefix+"%s: idle since %s, priority %d, above its min of %d (GPU sharing)",
			strings.Join(to, ", "), minuteText(p.usage[d.d.Name].LastRequest), d.d.Priority, d.d.Autoscale.Min)
		for _, name := range to {
			waitsFor[name] = append(waitsFor[name], e.rep.id)
		}
	}
	if len(evicted) == 0 {
		return plan
	}
	out := newPlanner(v, evicted).plan()
	for i, u := range out.Unplaced {
		if reps := waitsFor[u.Deployment]; len(reps) > 0 && needy[u.ShardID] != "" {
			out.Unplaced[i].Reason += fmt.Sprintf("; waits for idle replica %s to stop and free its GPUs (GPU sharing)", strings.Join(reps, ", "))
		}
	}
	return out
}

// EvictionPrefix begins the reason of every replica GPU sharing evicts.
const EvictionPrefix = "gives its GPUs to "

type heldKey struct{ node, shard, version string }

type nodeGPU struct {
	node string
	gpu  int
}

// minuteText is a Unix minute as a reader sees it.
func minuteText(m int64) string {
	if m <= 0 {
		return "before its decider's first look"
	}
	return time.Unix(m*60, 0).UTC().Format("2006-01-02 15:04Z")
}
