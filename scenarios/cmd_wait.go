package scenarios

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
)

func (r *runner) cmdWaitUntil(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	pos := d.positional()
	var within time.Duration
	if d.has("within") {
		var err error
		if within, err = d.duration("within", 0); err != nil {
			return "", time.Time{}, err
		}
	}
	if i := slices.Index(pos, "within"); i >= 0 {
		if within != 0 || i+1 >= len(pos) {
			return "", time.Time{}, usagef("wait-until: give the time once: within 10s")
		}
		v, err := time.ParseDuration(pos[i+1])
		if err != nil || v <= 0 {
			return "", time.Time{}, usagef("wait-until: within %q: want a duration such as 10s", pos[i+1])
		}
		within = v
		pos = slices.Delete(pos, i, i+2)
	}
	if within == 0 {
		return "", time.Time{}, usagef("wait-until: say how long: ... within 10s")
	}
	if len(pos) == 0 {
		return "", time.Time{}, usagef("wait-until: name a condition")
	}
	c, err := r.condition(d, pos[0], pos[1:])
	if err != nil {
		return "", time.Time{}, err
	}
	only, err := r.onNodes(d)
	if err != nil {
		return "", time.Time{}, err
	}
	hold, err := d.duration("for", 0)
	if err != nil {
		return "", time.Time{}, err
	}
	if hold >= within {
		return "", time.Time{}, usagef("wait-until: for=%v must be shorter than within %v", hold, within)
	}
	var since, first time.Time
	ok, last := r.poll(within, func() (bool, string) {
		obs := r.observers(only)
		if len(obs) == 0 {
			return false, "no node is up to ask"
		}
		start := time.Now()
		ok, detail := c(obs)
		switch {
		case !ok && !since.IsZero():
			detail = fmt.Sprintf("held for %.1fs, then: %s", time.Since(since).Seconds(), detail)
			since = time.Time{}
			return false, detail
		case !ok:
			return false, detail
		case since.IsZero():
			since, first = start, time.Now()
		}
		if time.Since(since) < hold {
			return false, ""
		}
		return true, ""
	})
	if !ok {
		if hold > 0 && !since.IsZero() {
			last = fmt.Sprintf("held only %.1fs of %v", time.Since(since).Seconds(), hold)
		}
		d.noEvent = true
		return fmt.Sprintf("timed out after %v: %s", within, last), time.Time{}, nil
	}
	// The event is when it came true, not when it had held long enough.
	return "ok", first, nil
}

// condition builds the named condition from its arguments.
func (r *runner) condition(d *directive, name string, args []string) (cond, error) {
	wantArgs := func(n int, what string) error {
		if len(args) != n {
			return usagef("wait-until %s: want %s", name, what)
		}
		return nil
	}
	switch name {
	case "all-placed":
		return r.condAllPlaced, wantArgs(0, "no positional arguments")
	case "all-ready":
		return r.condAllReady, wantArgs(0, "no positional arguments")
	case "replicas":
		if err := wantArgs(1, "a deployment name: replicas NAME ready=N"); err != nil {
			return nil, err
		}
		if !d.has("ready") {
			return nil, usagef("wait-until replicas: want ready=N")
		}
		n, err := d.integer("ready", 0)
		if err != nil {
			return nil, err
		}
		return func(obs []*node) (bool, string) { return r.condReplicas(obs, args[0], n) }, nil
	case "adapter":
		if err := wantArgs(1, "a LoRA adapter's name: adapter NAME ready=N"); err != nil {
			return nil, err
		}
		n, err := d.integer("ready", 0)
		if err != nil {
			return nil, err
		}
		return func(obs []*node) (bool, string) { return r.condAdapter(obs, args[0], n) }, nil
	case "members":
		want := map[string]int{}
		for _, k := range []string{"alive", "suspect", "dead", "left"} {
			if d.has(k) {
				v, err := d.integer(k, 0)
				if err != nil {
					return nil, err
				}
				want[k] = v
			}
		}
		if len(want) == 0 {
			return nil, usagef("wait-until members: want alive=N (or suspect=, dead=, left=)")
		}
		return func(obs []*node) (bool, string) { return r.condMembers(obs, want) }, wantArgs(0, "only key=value arguments")
	case "cached":
		if err := wantArgs(1, "a node: cached NODE model=M"); err != nil {
			return nil, err
		}
		model, err := d.need("model")
		if err != nil {
			return nil, err
		}
		ns, _, err := r.resolveNodes(r.ctx, args)
		if err != nil {
			return nil, err
		}
		return func(obs []*node) (bool, string) { return r.condCached(obs, ns[0].name, model) }, nil
	case "converged":
		return func(obs []*node) (bool, string) {
			ok, detail, _ := r.plansAgree(obs)
			return ok, detail
		}, wantArgs(0, "no positional arguments")
	case "single-holder":
		return func([]*node) (bool, string) {
			ok, detail, _ := r.singleHolder()
			return ok, detail
		}, wantArgs(0, "no positional arguments")
	case "serving":
		if err := wantArgs(1, "a deployment name: serving NAME"); err != nil {
			return nil, err
		}
		return func(obs []*node) (bool, string) { return r.condServing(obs[0], args[0]) }, nil
	case "restarts":
		if err := wantArgs(1, "SHARD>=N"); err != nil {
			return nil, err
		}
		shard, ns, ok := strings.Cut(args[0], ">=")
		n, err := strconv.Atoi(ns)
		if !ok || err != nil || shard == "" {
			return nil, usagef("wait-until restarts: want SHARD>=N, got %q", args[0])
		}
		return func(obs []*node) (bool, string) { return r.condRestarts(obs[0], shard, n) }, nil
	case "shard":
		if err := wantArgs(1, "a shard: shard SHARD status=S lease=L engine=running|gone"); err != nil {
			return nil, err
		}
		want := map[string]string{}
		for _, k := range []string{"status", "lease", "engine"} {
			if v, ok := d.kvRaw(k); ok {
				want[k] = v
			}
		}
		if e := want["engine"]; e != "" && e != "running" && e != "gone" {
			return nil, usagef("wait-until shard: engine=%s: want running or gone", e)
		}
		if len(want) == 0 {
			return nil, usagef("wait-until shard: say what to wait for: status=, lease= or engine=")
		}
		return func(obs []*node) (bool, string) { return r.condShard(obs[0], args[0], want) }, nil
	case "engines":
		if !d.has("running") {
			return nil, usagef("wait-until engines: want running=N")
		}
		n, err := d.integer("running", 0)
		if err != nil {
			return nil, err
		}
		return func([]*node) (bool, string) {
			if got := len(engineProcs(r.binaryPaths()...)); got != n {
				return false, fmt.Sprintf("%d engine processes run, want %d", got, n)
			}
			return true, ""
		}, wantArgs(0, "only running=N")
	case "served":
		if err := wantArgs(1, "a request loop: served LOOP by=NODE [after=EVENT]"); err != nil {
			return nil, err
		}
		l, ok := r.loops[args[0]]
		if !ok {
			return nil, usagef("wait-until served: request-loop %s: not started", args[0])
		}
		ref, err := d.need("by")
		if err != nil {
			return nil, err
		}
		ns, labels, err := r.resolveNodes(r.ctx, []string{ref})
		if err != nil {
			return nil, err
		}
		// after=EVENT: only requests sent after it count (served again).
		var from time.Time
		since := ""
		if afterRef, ok := d.kvRaw("after"); ok {
			if from, err = r.eventAt("after", afterRef); err != nil {
				return nil, err
			}
			since = " among those sent after " + afterRef
		}
		return func([]*node) (bool, string) {
			l.mu.Lock()
			defer l.mu.Unlock()
			for _, q := range l.reqs {
				if q.err == "" && q.node == ns[0].name && q.sent.After(from) {
					return true, ""
				}
			}
			return false, fmt.Sprintf("no answer of request-loop %s came from %s yet%s (%d requests)", l.name, labels[0], since, len(l.reqs))
		}, nil
	case "settled":
		if err := wantArgs(1, "a request loop: settled LOOP before=EVENT"); err != nil {
			return nil, err
		}
		l, ok := r.loops[args[0]]
		if !ok {
			return nil, usagef("wait-until settled: request-loop %s: not started", args[0])
		}
		ref, err := d.need("before")
		if err != nil {
			return nil, err
		}
		cut, err := r.eventAt("before", ref)
		if err != nil {
			return nil, err
		}
		return func([]*node) (bool, string) {
			if n, oldest := l.unsettled(cut); n > 0 {
				return false, fmt.Sprintf("%d requests of request-loop %s sent before %s are still in flight, the oldest for %.1fs", n, l.name, ref, oldest.Seconds())
			}
			return true, ""
		}, nil
	case "shards-agree":
		return r.condShardsAgree, wantArgs(0, "no positional arguments")
	case "isolated":
		return r.isolatedCondition(args)
	case "cluster-version":
		return r.clusterVersionCondition(args)
	case "no-orphans":
		return func([]*node) (bool, string) {
			ok, detail, _ := r.noOrphans()
			return ok, detail
		}, wantArgs(0, "no positional arguments")
	}
	return nil, usagef("wait-until: unknown condition %q (have all-placed, all-ready, replicas, adapter, members, converged, single-holder, serving, restarts, shard, served, settled, shards-agree, engines, no-orphans, isolated, cluster-version)", name)
}

// poll evaluates cond until it holds or within passes. The time returned is
// when the successful round finished: an upper bound on when it came true.
func (r *runner) poll(within time.Duration, c func() (bool, string)) (bool, string) {
	deadline := time.Now().Add(within)
	last := ""
	for {
		ok, detail := c()
		if ok {
			return true, ""
		}
		if detail != "" {
			last = detail
		}
		if time.Now().After(deadline) || r.ctx.Err() != nil {
			return false, last
		}
		clock.SleepReal(r.ctx, r.pollEvery)
	}
}
