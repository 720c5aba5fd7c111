package gateway

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func messagesBody(msgs ...string) []byte {
	b := []byte(`{"model":"m","messages":[`)
	for i := 0; i+1 < len(msgs); i += 2 {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"role":%q,"content":%q}`, msgs[i], msgs[i+1])
	}
	return append(b, `]}`...)
}

// long makes s a prompt prefix worth affinity (minPrefixBytes or more).
func long(s string) string { return strings.Repeat(s+" ", minPrefixBytes/len(s)+1) }

func key(t *testing.T, body string, ep endpoint, n int) uint64 {
	t.Helper()
	k, ok := prefixKey([]byte(body), ep, n)
	if !ok {
		t.Fatalf("no key for %s", body)
	}
	return k
}

func TestPrefixKeyIsCanonicalAndLeavesOutTheNewTurn(t *testing.T) {
	sys7 := long("You are tenant 7's assistant.")
	base := key(t, string(messagesBody("system", sys7, "user", "what is 2+2?")), chatEndpoint, 4096)
	escaped := strings.ReplaceAll(sys7, "'", `\u0027`)
	same := map[string]string{
		"spacing and key order": `{ "messages" : [ {"content":"` + sys7 + `", "role":"system"} , {"role":"user","content":"hi"} ], "model":"m", "stream":true }`,
		"escaped characters":    `{"model":"m","messages":[{"role":"system","content":"` + escaped + `"},{"role":"user","content":"x"}]}`,
		"another question":      string(messagesBody("system", sys7, "user", "tell me a joke")),
	}
	for name, b := range same {
		if k := key(t, b, chatEndpoint, 4096); k != base {
			t.Errorf("%s: key %x, want %x (same prefix)", name, k, base)
		}
	}
	other := key(t, string(messagesBody("system", long("You are tenant 8's assistant."), "user", "what is 2+2?")), chatEndpoint, 4096)
	if other == base {
		t.Error("another system prompt gave the same key")
	}
	swapped := key(t, string(messagesBody("user", sys7, "user", "what is 2+2?")), chatEndpoint, 4096)
	if swapped == base {
		t.Error("another role gave the same key")
	}
	// One message alone is its own prefix.
	one := key(t, string(messagesBody("user", long("hello"))), chatEndpoint, 4096)
	if one == key(t, string(messagesBody("user", long("goodbye"))), chatEndpoint, 4096) {
		t.Error("single messages that differ gave the same key")
	}
	// Only the first maxBytes count.
	a := key(t, `{"model":"m","prompt":"0123456789abcdef-A"}`, completionsEndpoint, 16)
	b := key(t, `{"model":"m","prompt":"0123456789abcdef-B"}`, completionsEndpoint, 16)
	c := key(t, `{"model":"m","prompt":"0123456789abcdeX-A"}`, completionsEndpoint, 16)
	if a != b || a == c {
		t.Errorf("prompt cut at 16 bytes: keys %x %x %x, want the first two equal and the third not", a, b, c)
	}
	for _, tc := range []struct {
		body string
		ep   endpoint
	}{
		{`{"model":"m","input":"embed me"}`, embeddingsEndpoint},
		{`{"model":"m","prompt":""}`, completionsEndpoint},
		// Too short to be worth affinity: a question alone, or a short
		// system prompt before it.
		{`{"model":"m","messages":[{"role":"user","content":"what is 2+2?"}]}`, chatEndpoint},
		{string(messagesBody("system", "Be terse.", "user", long("a long question"))), chatEndpoint},
		{`{"model":"m","messages":"not a list"}`, chatEndpoint},
		{`not json`, chatEndpoint},
	} {
		if _, ok := prefixKey([]byte(tc.body), tc.ep, 4096); ok {
			t.Errorf("%s: got a key, want none", tc.body)
		}
	}
}

func routes(ids ...string) []Route {
	out := make([]Route, len(ids))
	for i, id := range ids {
		out[i] = Route{EngineID: id, URL: "http://" + id}
	}
	return out
}

func cands(rs []Route, loads ...float64) []Candidate {
	out := make([]Candidate, len(rs))
	for i := range rs {
		out[i] = Candidate{Route: &rs[i]}
		if i < len(loads) {
			out[i].Load = loads[i]
		}
	}
	return out
}

// Gateways share no state; the same view must still give the same answer,
// whatever order each lists the replicas in.
func TestPrefixSameReplicaOnEveryGatewayWithTheSameView(t *testing.T) {
	rs := routes("r0", "r1", "r2", "r3", "r4")
	rev := []Route{rs[4], rs[3], rs[2], rs[1], rs[0]}
	g1, g2 := &Prefix{}, &Prefix{}
	used := map[string]bool{}
	for i := range 200 {
		body := messagesBody("system", long(fmt.Sprintf("tenant %d", i)), "user", "q")
		c1 := cands(rs, 3, 1, 4, 1, 5)
		c2 := cands(rev, 5, 1, 4, 1, 3)
		a := c1[g1.Choose(&Request{Body: body, ep: chatEndpoint}, c1).Index].Route.EngineID
		b := c2[g2.Choose(&Request{Body: body, ep: chatEndpoint}, c2).Index].Route.EngineID
		if a != b {
			t.Fatalf("tenant %d: gateway 1 chose %s, gateway 2 %s", i, a, b)
		}
		used[a] = true
	}
	// Loads 3 1 4 1 5: the bound is ceil(1.25 x 15 / 5) = 4, so r2 and r4
	// (which would reach 5 and 6) take nothing and the rest share.
	if len(used) != 3 || !used["r0"] || !used["r1"] || !used["r3"] {
		t.Errorf("200 tenants went to %v, want r0, r1 and r3", used)
	}
}

// The rendezvous property: when a replica leaves, only the prefixes it was
// first for move; every other prefix keeps its replica.
func TestPrefixReplicaLeavingMovesOnlyItsOwnPrefixes(t *testing.T) {
	all := routes("a", "b", "c", "d", "e")
	without := append(append([]Route{}, all[:2]...), all[3:]...) // c left
	p := &Prefix{}
	moved, onC := 0, 0
	for i := range 2000 {
		req := func() *Request {
			return &Request{Body: messagesBody("user", long(fmt.Sprint("p", i))), ep: chatEndpoint}
		}
		ca := cands(all)
		before := ca[p.Choose(req(), ca).Index].Route.EngineID
		cw := cands(without)
		after := cw[p.Choose(req(), cw).Index].Route.EngineID
		if before == "c" {
			onC++
			continue
		}
		if after != before {
			moved++
		}
	}
	if moved != 0 {
		t.Errorf("%d prefixes not on c moved when c left", moved)
	}
	if onC < 300 || onC > 500 {
		t.Errorf("c was first for %d of 2000 prefixes, want about 400", onC)
	}
}

// A replica over the bound is passed over for the next in the prefix's
// order, and the outcome says so.
func TestPrefixSpillsPastTheLoadBound(t *testing.T) {
	rs := routes("a", "b", "c", "d")
	p := &Prefix{}
	req := &Request{Body: messagesBody("user", long("hot tenant")), ep: chatEndpoint}
	idle := cands(rs)
	ch := p.Choose(req, idle)
	if ch.Outcome != AffinityTaken {
		t.Fatalf("idle replicas: outcome %q, want taken", ch.Outcome)
	}
	loads := make([]float64, 4)
	loads[ch.Index] = 10 // the favourite is far above the mean of 2.5
	busy := cands(rs, loads...)
	ch2 := p.Choose(&Request{Body: req.Body, ep: chatEndpoint}, busy)
	if ch2.Outcome != AffinitySpilled || ch2.Index == ch.Index {
		t.Fatalf("favourite at 10, others idle: chose %d (%q), want another replica, spilled", ch2.Index, ch2.Outcome)
	}
	if got := (&Prefix{}).Choose(&Request{Body: []byte(`{"model":"m","input":"x"}`), ep: embeddingsEndpoint}, cands(rs, 3, 0, 2, 1)); got.Index != 1 || got.Outcome != AffinityUnkeyed {
		t.Fatalf("embeddings: %+v, want the least loaded (1), unkeyed", got)
	}
}

// The bounded-load rule holds with several gateways sending at once, each
// seeing the engines' reported loads (refreshed at scrapes) plus only its
// own requests since. Between scrapes each gateway knows nothing of the
// others' new requests; at an instant that alone can put one request per
// gateway on one replica, so the bound shared-nothing gateways can keep is
// max(ceil(balance x mean), affinityFloor) + (gateways - 1); with one
// gateway it is exact.
func TestBoundedLoadHoldsWithGatewaysInterleaving(t *testing.T) {
	for _, gws := range []int{1, 3} {
		t.Run(fmt.Sprint(gws, "gateways"), func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) { checkBoundedLoad(t, gws) })
		})
	}
}

func checkBoundedLoad(t *rapid.T, gws int) {
	const balance = 1.25
	nextID := 0
	ids := []string{}
	add := func() {
		ids = append(ids, fmt.Sprint("r", nextID))
		nextID++
	}
	for range rapid.IntRange(1, 6).Draw(t, "replicas") {
		add()
	}
	// A request in flight, and whether the last scrape counted it.
	type request struct {
		gw      int
		id      string
		counted bool
	}
	var inflight []request
	for _, id := range ids {
		for range rapid.IntRange(0, 20).Draw(t, "initial-"+id) {
			inflight = append(inflight, request{gw: -1, id: id, counted: true})
		}
	}
	// What each gateway knows besides the scrape: own[g][id], its requests
	// in flight to id since the scrape; gone[g][id], its requests the scrape
	// counted that have finished since.
	reported := map[string]float64{}
	sent := 0 // requests sent since the scrape, finished or not
	own := make([]map[string]float64, gws)
	gone := make([]map[string]float64, gws)
	// refresh is a scrape by every gateway: the engines report what they
	// hold, and no gateway has requests the engines have not seen.
	refresh := func() {
		clear(reported)
		for i := range inflight {
			reported[inflight[i].id]++
			inflight[i].counted = true
		}
		for g := range own {
			own[g], gone[g] = map[string]float64{}, map[string]float64{}
		}
		sent = 0
	}
	refresh()
	p := &Prefix{Balance: balance}
	steps := rapid.IntRange(1, 300).Draw(t, "steps")
	for s := range steps {
		switch op := rapid.IntRange(0, 19).Draw(t, "op"); {
		case op == 0: // a scrape: some requests finished
			inflight = slices.DeleteFunc(inflight, func(request) bool { return rapid.Bool().Draw(t, "finish") })
			refresh()
		case op == 3 && len(inflight) > 0: // one request finishes between scrapes
			i := rapid.IntRange(0, len(inflight)-1).Draw(t, "finished")
			r := inflight[i]
			inflight = slices.Delete(inflight, i, i+1)
			switch {
			case r.gw < 0: // a request of a gateway out of the model: nobody learns of it
			case r.counted:
				gone[r.gw][r.id]++
			default:
				own[r.gw][r.id]--
			}
		// Replicas come and go with a new view, which the model gives
		// every gateway together with a scrape: a gateway that had a single
		// replica to send to could not keep any bound, and one that learns
		// of a new replica before its next scrape judges a stale load.
		case op == 1 && len(ids) > 1: // a replica leaves
			i := rapid.IntRange(0, len(ids)-1).Draw(t, "leave")
			leaving := ids[i]
			ids = slices.Delete(ids, i, i+1)
			inflight = slices.DeleteFunc(inflight, func(r request) bool { return r.id == leaving })
			refresh()
		case op == 2 && len(ids) < 8: // a replica joins, empty
			add()
			refresh()
		default: // gateway g routes one request
			g := rapid.IntRange(0, gws-1).Draw(t, "gateway")
			rs := routes(ids...)
			cs := make([]Candidate, len(rs))
			for i := range rs {
				id := rs[i].EngineID
				o := own[g][id]
				cs[i] = Candidate{Route: &rs[i], Load: max(0, reported[id]-gone[g][id]) + o, Own: o}
			}
			body := messagesBody("user", long(fmt.Sprint("tenant ", rapid.IntRange(0, 5).Draw(t, "tenant"))))
			ch := p.Choose(&Request{Body: body, ep: chatEndpoint, Others: float64(gws - 1)}, cs)
			id := rs[ch.Index].EngineID
			own[g][id]++
			sent++
			inflight = append(inflight, request{gw: g, id: id})
			load := map[string]float64{}
			for _, r := range inflight {
				load[r.id]++
			}
			// The bound is judged on the load last scraped plus all that was
			// sent since: no gateway hears of the others' finished requests
			// before the next scrape, so none can judge on less.
			total := float64(sent)
			for _, x := range ids {
				total += reported[x]
			}
			bound := max(math.Ceil(balance*total/float64(len(ids))), affinityFloor) + float64(gws-1)
			if load[id] > bound {
				t.Fatalf("step %d: gateway %d put %s at load %v, over the bound %v (total %v over %d replicas)",
					s, g, id, load[id], bound, total, len(ids))
			}
		}
	}
}
