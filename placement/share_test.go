package placement

import (
	"strings"
	"testing"
)

func autoscaled(min, max int) func(*Deployment) {
	return func(d *Deployment) { d.Autoscale = &Autoscale{Min: min, Max: max} }
}

func priority(n int) func(*Deployment) { return func(d *Deployment) { d.Priority = n } }

// shareView is nodes of one 80 GiB GPU each; deployments of 60 GiB a
// shard, so that two never share a GPU.
func shareView(nodes []Node, deps ...Deployment) View {
	return View{Nodes: nodes, Deployments: deps, Share: true, Usage: map[string]Usage{}}
}

func gpu80(name string, opts ...nodeOpt) Node {
	return mkNode(name, hgpus(1, "H100", 80, false), opts...)
}

// A deployment with demand that does not fit takes the GPUs of an idle
// one: the idle replica is let go (its holder stops it) while the GPU
// stays reserved; one pass after its record drops it the deployment with
// demand is placed there, and the idle one is not placed back. When
// demand moves back, the roles swap. Without sharing nothing moves.
func TestShareMovesGPUsToDemand(t *testing.T) {
	a := mkDep("a", memGiB(60), autoscaled(0, 1))
	b := mkDep("b", memGiB(60), autoscaled(0, 1))
	v := shareView([]Node{gpu80("n1", holding(hold("a-0", version(a), LeaseValid, 1, 0)))}, a, b)
	v.Usage["a"] = Usage{Idle: true, LastRequest: 29_000_000}

	off := v
	off.Share = false
	if p := Compute(off); len(find(p, "a-0")) != 1 {
		t.Fatalf("without sharing a-0 was not kept: %+v", p)
	}

	p := Compute(v)
	if len(find(p, "a-0")) != 0 {
		t.Fatalf("a-0 kept though idle and b has demand: %+v", p.Assignments)
	}
	ua, _ := unplaced(p, "a-0")
	if !strings.Contains(ua.Reason, "gives its GPUs to b: idle since 2025-02-19 21:20Z, priority 0, above its min of 0") {
		t.Errorf("a-0's reason: %q", ua.Reason)
	}
	ub, _ := unplaced(p, "b-0")
	if !strings.Contains(ub.Reason, "waits for idle replica a-0 to stop") {
		t.Errorf("b-0's reason: %q", ub.Reason)
	}
	if again := Compute(v); mustJSON(t, again) != mustJSON(t, p) {
		t.Error("two computes of one view differ")
	}

	// a-0's holder stopped it: b takes the GPU, a waits behind it.
	v.Nodes[0].Shards = nil
	p = Compute(v)
	if got := find(p, "b-0"); len(got) != 1 || got[0].Node != "n1" {
		t.Fatalf("b-0 not placed on the freed GPU: %+v", p)
	}
	if u, ok := unplaced(p, "a-0"); !ok || !strings.HasSuffix(u.Reason, "; idle, it gives way to deployments with demand (GPU sharing)") {
		t.Fatalf("a-0 placed back beside b, or not said why: %+v", p)
	}

	// Demand moves back: b idles, a is asked for.
	v.Nodes[0].Shards = []HeldShard{hold("b-0", version(b), LeaseValid, 2, 0)}
	v.Usage = map[string]Usage{"b": {Idle: true, LastRequest: 29_000_010}}
	p = Compute(v)
	if len(find(p, "b-0")) != 0 {
		t.Fatalf("b-0 kept though idle and a has demand: %+v", p.Assignments)
	}
	if u, _ := unplaced(p, "b-0"); !strings.Contains(u.Reason, "gives its GPUs to a") {
		t.Errorf("b-0's reason: %q", u.Reason)
	}
}

// Never below min, never a deployment that is not idle, never a fixed
// deployment: then the one with demand waits, as without sharing.
func TestShareSparesWhatMayNotGo(t *testing.T) {
	b := mkDep("b", memGiB(60))
	for name, tc := range map[string]struct {
		a     Deployment
		usage Usage
	}{
		"at its min":  {mkDep("a", memGiB(60), autoscaled(1, 2)), Usage{Idle: true}},
		"not idle":    {mkDep("a", memGiB(60), autoscaled(0, 2)), Usage{}},
		"fixed count": {mkDep("a", memGiB(60)), Usage{Idle: true}},
	} {
		v := shareView([]Node{gpu80("n1", holding(hold("a-0", version(tc.a), LeaseValid, 1, 0)))}, tc.a, b)
		v.Usage["a"] = tc.usage
		p := Compute(v)
		if len(find(p, "a-0")) != 1 {
			t.Errorf("%s: a-0 evicted: %+v", name, p.Unplaced)
		}
		if u, _ := unplaced(p, "b-0"); strings.Contains(u.Reason, "sharing") {
			t.Errorf("%s: b-0 waits for sharing: %q", name, u.Reason)
		}
	}
}

// Candidates go lowest priority first, then least recently used; a
// replica above the min of a deployment at two goes before... only the
// first that frees enough goes.
func TestShareOrder(t *testing.T) {
	b := mkDep("b", memGiB(60), tp(1))
	cases := []struct {
		name    string
		x, y    Usage
		px, py  int
		evicted string
	}{
		{"lower priority first", Usage{Idle: true, LastRequest: 100}, Usage{Idle: true, LastRequest: 50}, 0, 5, "x-0"},
		{"then least recently used", Usage{Idle: true, LastRequest: 100}, Usage{Idle: true, LastRequest: 50}, 3, 3, "y-0"},
		{"then by name", Usage{Idle: true, LastRequest: 50}, Usage{Idle: true, LastRequest: 50}, 3, 3, "x-0"},
	}
	for _, tc := range cases {
		x := mkDep("x", memGiB(60), autoscaled(0, 1), priority(tc.px))
		y := mkDep("y", memGiB(60), autoscaled(0, 1), priority(tc.py))
		v := shareView([]Node{
			gpu80("n1", holding(hold("x-0", version(x), LeaseValid, 1, 0))),
			gpu80("n2", holding(hold("y-0", version(y), LeaseValid, 2, 0))),
		}, x, y, b)
		v.Usage["x"], v.Usage["y"] = tc.x, tc.y
		p := Compute(v)
		var gone []string
		for _, id := range []string{"x-0", "y-0"} {
			if len(find(p, id)) == 0 {
				gone = append(gone, id)
			}
		}
		if len(gone) != 1 || gone[0] != tc.evicted {
			t.Errorf("%s: evicted %v, want [%s]", tc.name, gone, tc.evicted)
		}
	}
}

// A candidate whose GPUs would not help keeps running: the trial frees
// the first two in order, and only the one whose GPU it gave away goes.
func TestShareEvictsOnlyWhatHelps(t *testing.T) {
	b := mkDep("b", memGiB(60), labels("zone", "x"))
	low := mkDep("low", memGiB(60), autoscaled(0, 1), priority(-5))
	high := mkDep("high", memGiB(60), autoscaled(0, 1))
	v := shareView([]Node{
		gpu80("n1", holding(hold("low-0", version(low), LeaseValid, 1, 0))),
		gpu80("n2", withLabels("zone", "x"), holding(hold("high-0", version(high), LeaseValid, 2, 0))),
	}, b, low, high)
	v.Usage["low"] = Usage{Idle: true}
	v.Usage["high"] = Usage{Idle: true}
	p := Compute(v)
	if len(find(p, "low-0")) != 1 {
		t.Errorf("low-0 evicted though b cannot use its node: %+v", p.Unplaced)
	}
	if len(find(p, "high-0")) != 0 {
		t.Errorf("high-0 kept though b fits only there: %+v", p.Assignments)
	}
}

// While an evicted replica stops, its GPUs are on their way out: no
// other idle replica is evicted for the same need.
func TestShareWaitsForGPUsOnTheirWayOut(t *testing.T) {
	a := mkDep("a", memGiB(60), autoscaled(0, 1))
	c := mkDep("c", memGiB(60), autoscaled(0, 1))
	b := mkDep("b", memGiB(60))
	stopping := hold("a-0", version(a), LeaseLapsed, 1, 0)
	v := shareView([]Node{
		gpu80("n1", holding(stopping)),
		gpu80("n2", holding(hold("c-0", version(c), LeaseValid, 2, 0))),
	}, a, b, c)
	v.Usage["a"] = Usage{Idle: true}
	v.Usage["c"] = Usage{Idle: true}
	p := Compute(v)
	if len(find(p, "c-0")) != 1 {
		t.Errorf("c-0 evicted while a-0's GPU is being freed: %+v", p.Unplaced)
	}
}

// A multi-shard gang takes the GPUs of several idle replicas at once.
func TestShareFreesEnoughForAGang(t *testing.T) {
	big := mkDep("big", memGiB(60), pp(2))
	var nodes []Node
	var deps []Deployment
	v := shareView(nil)
	for i, name := range []string{"p", "q", "r"} {
		d := mkDep(name, memGiB(60), autoscaled(0, 1), priority(i))
		deps = append(deps, d)
		nodes = append(nodes, gpu80("n"+name, holding(hold(name+"-0", version(d), LeaseValid, int64(i+1), 0))))
		v.Usage[name] = Usage{Idle: true}
	}
	v.Nodes, v.Deployments = nodes, append(deps, big)
	p := Compute(v)
	var gone []string
	for _, id := range []string{"p-0", "q-0", "r-0"} {
		if len(find(p, id)) == 0 {
			gone = append(gone, id)
		}
	}
	if strings.Join(gone, ",") != "p-0,q-0" {
		t.Errorf("evicted %v, want the two lowest priorities p-0,q-0", gone)
	}
}

// A priority outside its bounds is refused naming the field.
func TestPriorityBounds(t *testing.T) {
	_, err := DecodeDeployment([]byte(`{"name":"chat","model":"m","priority":5000}`))
	if err == nil || !strings.Contains(err.Error(), `priority: invalid value "5000": an integer from -1000 to 1000`) {
		t.Errorf("priority 5000: %v", err)
	}
	d, err := DecodeDeployment([]byte(`{"name":"chat","model":"m","priority":-7}`))
	if err != nil || d.Priority != -7 {
		t.Fatalf("priority -7: %+v, %v", d, err)
	}
	if plain := (Deployment{Name: "chat", Model: "m"}); plain.SpecVersion() != d.SpecVersion() {
		t.Error("priority changed the spec version: it must restart nothing")
	}
}
