package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/profile"
)

// --- the order requests are let through in (the queue alone) ---

func keyOf(b byte) [sha256.Size]byte {
	var k [sha256.Size]byte
	k[0] = b
	return k
}

// drain pops every request, naming each by its class's first letter and
// its key's first byte.
func drainOrder(q *depQueue, qs *queues) string {
	var b strings.Builder
	for w := q.pop(qs); w != nil; w = q.pop(qs) {
		fmt.Fprintf(&b, "%c%d ", w.class.String()[0], w.key[0])
	}
	return strings.TrimSpace(b.String())
}

// Two keys of one class: the one that floods the queue does not hold back
// the other, which gets every other turn (deficit round robin, a request
// each). First come, first served would let key 2 wait behind all of
// key 1's.
func TestQueueKeysOfAClassTakeTurns(t *testing.T) {
	q, qs := &depQueue{name: "chat"}, &queues{}
	for range 6 {
		q.push(qs, &waiter{class: PriorityDefault, key: keyOf(1)})
	}
	for range 2 {
		q.push(qs, &waiter{class: PriorityDefault, key: keyOf(2)})
	}
	if got, want := drainOrder(q, qs), "d1 d2 d1 d2 d1 d1 d1 d1"; got != want {
		t.Fatalf("order %q, want %q", got, want)
	}
	if q.n != 0 || qs.total.Load() != 0 {
		t.Fatalf("after all popped: %d waiting, %d in all", q.n, qs.total.Load())
	}
}

// Interactive requests go ahead of default and batch ones that were
// waiting before them, whatever the order they came in.
func TestQueueInteractiveGoesFirst(t *testing.T) {
	q, qs := &depQueue{name: "chat"}, &queues{}
	for _, c := range []Priority{PriorityBatch, PriorityBatch, PriorityDefault, PriorityInteractive, PriorityBatch, PriorityInteractive} {
		q.push(qs, &waiter{class: c})
	}
	if got, want := drainOrder(q, qs), "i0 i0 d0 b0 b0 b0"; got != want {
		t.Fatalf("order %q, want %q", got, want)
	}
	// A class that was idle goes next when it comes back, ahead of a
	// backlog of batch: it starts from the pass of the last let through.
	for range 5 {
		q.push(qs, &waiter{class: PriorityBatch})
	}
	q.pop(qs)
	q.pop(qs)
	q.push(qs, &waiter{class: PriorityInteractive})
	if w := q.pop(qs); w.class != PriorityInteractive {
		t.Fatalf("after a batch backlog, an interactive request that arrives goes %s first", w.class)
	}
}

// Under a steady interactive flood (and a default one), batch still gets
// its weight's share of what is let through: never starved.
func TestQueueBatchIsNotStarved(t *testing.T) {
	// The shares are written out, not read from weight: a batch weight
	// of zero (strict priority) must fail here.
	for _, tc := range []struct {
		flood []Priority
		sum   float64
	}{{[]Priority{PriorityInteractive}, 16 + 1}, {[]Priority{PriorityInteractive, PriorityDefault}, 16 + 4 + 1}} {
		flood := tc.flood
		q, qs := &depQueue{name: "chat"}, &queues{}
		for _, c := range flood {
			q.push(qs, &waiter{class: c})
		}
		q.push(qs, &waiter{class: PriorityBatch})
		const n = 21 * 17 * 2
		got := map[Priority]int{}
		for range n {
			w := q.pop(qs)
			got[w.class]++
			q.push(qs, &waiter{class: w.class}) // every class keeps one waiting
		}
		if min := int(float64(n)/tc.sum) - 1; got[PriorityBatch] < min {
			t.Errorf("flood of %v: batch let through %d of %d, want at least %d (its weight's share); all: %v", flood, got[PriorityBatch], n, min, got)
		}
		if got[PriorityInteractive] < got[PriorityBatch]*15 {
			t.Errorf("flood of %v: interactive %d against batch %d, want about 16 to 1", flood, got[PriorityInteractive], got[PriorityBatch])
		}
	}
}

// --- through the gateway ---

// gate is an engine stand-in whose requests wait until let go: one by
// one (next) or all at once (open).
type gate struct {
	*upstream
	one  chan struct{}
	all  chan struct{}
	once sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{one: make(chan struct{}), all: make(chan struct{})}
	g.upstream = newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-g.one:
		case <-g.all:
		}
		chatOK(w, r)
	})
	return g
}

func (g *gate) open() { g.once.Do(func() { close(g.all) }) }

// next lets one request end and waits until the next one reaches the
// engine; it hands back the tag (its prompt) of that one.
func (g *gate) next(t *testing.T) string {
	t.Helper()
	n := g.hits.Load()
	g.one <- struct{}{}
	testwait.Until(t, 5*time.Second, "the next request at the engine", func() (bool, string) {
		return g.hits.Load() > n, fmt.Sprintf("%d requests reached it", g.hits.Load())
	})
	return tagOf(g.lastBody())
}

func tagOf(body []byte) string {
	var req struct {
		Messages []struct{ Content string }
	}
	if json.Unmarshal(body, &req) != nil || len(req.Messages) == 0 {
		return "?"
	}
	return req.Messages[0].Content
}

func taggedChat(tag string) string {
	return fmt.Sprintf(`{"model":"chat","messages":[{"role":"user","content":%q}]}`, tag)
}

// boundedChat is deployment chat whose replicas, one per URL, each hold at
// most bound requests (max_num_seqs) before requests queue.
func boundedChat(bound int, urls ...string) *world {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Replicas: len(urls), MaxNumSeqs: bound})
	for i, u := range urls {
		n := fmt.Sprintf("n%d", i+1)
		w.node(n, gossip.StateAlive)
		w.hold(cp{dep: "chat", replica: i, node: n, url: u})
	}
	return w
}

// queueConfig has no load scrapes (the fake profile's metrics are taken
// out), so the estimate is this gateway's requests in flight: exact.
func queueConfig() Config {
	return Config{Profiles: map[string]profile.Profile{"fake": {}}, PriorityHeader: "X-Priority"}
}

// queueHarness is a gateway in front of one gated replica of bound 1,
// with a first request holding it.
func queueHarness(t *testing.T, cfg Config) (*harness, *gate, <-chan answer) {
	t.Helper()
	g := newGate(t)
	h := newHarness(t, cfg, boundedChat(1, g.URL).snapshot())
	t.Cleanup(g.open) // before the harness's stop, which waits for the requests
	first := h.send("first")
	testwait.Until(t, 5*time.Second, "the first request at the engine", func() (bool, string) { return g.hits.Load() == 1, "" })
	return h, g, first
}

// send posts a chat tagged tag, with header pairs, and hands back its
// answer.
func (h *harness) send(tag string, hdr ...string) <-chan answer {
	out := make(chan answer, 1)
	go func() { out <- h.post("/v1/chat/completions", taggedChat(tag), hdr...) }()
	return out
}

// queued sends a request and waits until it waits in the queue, the
// queue then holding n.
func (h *harness) queued(n int, tag string, hdr ...string) <-chan answer {
	h.t.Helper()
	out := h.send(tag, hdr...)
	testwait.Until(h.t, 5*time.Second, fmt.Sprintf("%s queued (%d waiting)", tag, n), func() (bool, string) {
		select {
		case a := <-out:
			h.t.Fatalf("%s answered %d %s, want it queued", tag, a.status, a.body)
		default:
		}
		return h.gw.Queued()["chat"] == n, fmt.Sprintf("queued %v", h.gw.Queued())
	})
	return out
}

// gathered is one metric family of the gateway's, by name, each series
// keyed by its label values joined with commas.
func gathered(t *testing.T, g *Gateway, name string) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(g)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetValue())
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
			out[strings.Join(ls, ",")] = v
		}
	}
	return out
}

// When its one replica holds its bound, requests wait at the gateway and
// go as it frees room: interactive ones (by the allowed header) ahead of
// batch ones that came first, and, within a class, the keys in turn.
// Without the queue every request went to the engine at once.
func TestQueueServesByClassThenKeysInTurn(t *testing.T) {
	h, g, first := queueHarness(t, queueConfig())
	ks, err := ParseKeys(strings.NewReader("sk-team-a-aaaaaaaaaaaa a priority=batch\nsk-team-b-bbbbbbbbbbbb b priority=batch\n"))
	if err != nil {
		t.Fatal(err)
	}
	h.gw.SetKeys(ks)
	a := []string{"Authorization", "Bearer sk-team-a-aaaaaaaaaaaa"}
	b := []string{"Authorization", "Bearer sk-team-b-bbbbbbbbbbbb"}
	var answers []<-chan answer
	for i, tag := range []string{"a1", "a2", "a3"} {
		answers = append(answers, h.queued(i+1, tag, a...))
	}
	answers = append(answers, h.queued(4, "b1", b...))
	// The header outranks the key's class.
	answers = append(answers, h.queued(5, "i1", append([]string{"X-Priority", "interactive"}, a...)...))
	depth := gathered(t, h.gw, "llmgw_gateway_queue_depth")
	if depth["chat,batch"] != 4 || depth["chat,interactive"] != 1 || depth["chat,default"] != 0 {
		t.Errorf("queue depth %v, want 4 batch and 1 interactive", depth)
	}
	var order []string
	for range 5 {
		order = append(order, g.next(t))
	}
	if got, want := strings.Join(order, " "), "i1 a1 b1 a2 a3"; got != want {
		t.Errorf("let through %q, want %q", got, want)
	}
	g.open()
	for _, c := range append(answers, first) {
		if ans := <-c; ans.status != 200 {
			t.Errorf("answer %d %s", ans.status, ans.body)
		}
	}
	if w := gathered(t, h.gw, "llmgw_gateway_queue_wait_seconds"); w["chat,batch"] != 4 || w["chat,interactive"] != 1 {
		t.Errorf("queue waits observed %v, want 4 batch and 1 interactive", w)
	}
}

// The queue engages only when every replica holds its bound: two
// replicas of bound 2 take four requests at once, the fifth waits.
func TestQueueOnlyWhenEveryReplicaIsFull(t *testing.T) {
	g1, g2 := newGate(t), newGate(t)
	h := newHarness(t, queueConfig(), boundedChat(2, g1.URL, g2.URL).snapshot())
	t.Cleanup(g1.open)
	t.Cleanup(g2.open)
	var answers []<-chan answer
	for i := range 4 {
		answers = append(answers, h.send(fmt.Sprint(i)))
	}
	testwait.Until(t, 5*time.Second, "four requests at the engines", func() (bool, string) {
		return g1.hits.Load() == 2 && g2.hits.Load() == 2, fmt.Sprintf("%d and %d", g1.hits.Load(), g2.hits.Load())
	})
	answers = append(answers, h.queued(1, "fifth"))
	g2.one <- struct{}{}
	testwait.Until(t, 5*time.Second, "the fifth at the replica that freed room", func() (bool, string) {
		return g2.hits.Load() == 3 && len(h.gw.Queued()) == 0, fmt.Sprintf("%d, queued %v", g2.hits.Load(), h.gw.Queued())
	})
	g1.open()
	g2.open()
	for _, c := range answers {
		if a := <-c; a.status != 200 {
			t.Errorf("answer %d %s", a.status, a.body)
		}
	}
}

// A deployment with neither target_inflight nor max_num_seqs has no
// bound: nothing queues, however many requests an engine holds.
func TestNoBoundNoQueue(t *testing.T) {
	g := newGate(t)
	h := newHarness(t, queueConfig(), oneDeployment(g.URL).snapshot())
	t.Cleanup(g.open)
	if e, _ := h.gw.Table().Entry("chat"); e.Bound != 0 {
		t.Fatalf("bound %d without target_inflight or max_num_seqs", e.Bound)
	}
	var answers []<-chan answer
	for i := range 12 {
		answers = append(answers, h.send(fmt.Sprint(i)))
	}
	testwait.Until(t, 5*time.Second, "all 12 at the engine", func() (bool, string) {
		return g.hits.Load() == 12, fmt.Sprintf("%d there, queued %v", g.hits.Load(), h.gw.Queued())
	})
	g.open()
	for _, c := range answers {
		if a := <-c; a.status != 200 {
			t.Errorf("answer %d %s", a.status, a.body)
		}
	}
}

// target_inflight, when set, is the bound, ahead of max_num_seqs.
func TestBoundIsTargetInflightElseMaxNumSeqs(t *testing.T) {
	for _, tc := range []struct {
		d    placement.Deployment
		want int
	}{
		{placement.Deployment{MaxNumSeqs: 4}, 4},
		{placement.Deployment{MaxNumSeqs: 4, Autoscale: &placement.Autoscale{Min: 1, Max: 3, TargetInflight: 2}}, 2},
		{placement.Deployment{Autoscale: &placement.Autoscale{Min: 1, Max: 3}}, 0},
		{placement.Deployment{}, 0},
	} {
		if got := replicaBound(tc.d); got != tc.want {
			t.Errorf("%+v: bound %d, want %d", tc.d, got, tc.want)
		}
	}
}

// Past the queue's depth, 429 queue_full with Retry-After, naming the
// deployment and the bound; past its wait, 429 queue_timeout.
func TestQueueBounds(t *testing.T) {
	cfg := queueConfig()
	cfg.QueueDepth, cfg.QueueWait = 1, time.Second
	h, g, first := queueHarness(t, cfg)
	waiting := h.queued(1, "second", "X-Priority", "batch")
	a := h.post("/v1/chat/completions", taggedChat("third"), "X-Priority", "batch")
	if e := a.apiError(t); a.status != 429 || e.Error.Code != "queue_full" || a.header.Get("Retry-After") != "5" ||
		!strings.Contains(e.Error.Message, `"chat"`) || !strings.Contains(e.Error.Message, "bound of 1 requests") {
		t.Errorf("past the depth: %d %+v Retry-After %q", a.status, e, a.header.Get("Retry-After"))
	}
	// The waiting request's timer and the queue's recheck ticker.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.clock.BlockUntilContext(ctx, 2); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(time.Second)
	a = <-waiting
	if e := a.apiError(t); a.status != 429 || e.Error.Code != "queue_timeout" || a.header.Get("Retry-After") == "" || !strings.Contains(e.Error.Message, "waited 1s") {
		t.Errorf("past the wait: %d %+v", a.status, e)
	}
	if r := gathered(t, h.gw, "llmgw_gateway_queue_rejected_total"); r["chat,batch,full"] != 1 || r["chat,batch,expired"] != 1 {
		t.Errorf("rejected %v, want one full and one expired", r)
	}
	if n := g.hits.Load(); n != 1 {
		t.Errorf("%d requests reached the engine, want only the first", n)
	}
	g.open()
	if a := <-first; a.status != 200 {
		t.Errorf("first: %d %s", a.status, a.body)
	}
}

// A client that goes away leaves the queue at once, and never reaches
// the engine.
func TestQueueClientGoneLeaves(t *testing.T) {
	h, g, first := queueHarness(t, queueConfig())
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(taggedChat("gone")))
		if resp, err := h.srv.Client().Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("the cancelled request was answered %d", resp.StatusCode)
		} else if !errors.Is(err, context.Canceled) {
			t.Errorf("the cancelled request: %v", err)
		}
	}()
	testwait.Until(t, 5*time.Second, "the request queued", func() (bool, string) { return h.gw.Queued()["chat"] == 1, "" })
	later := h.queued(2, "later")
	cancel()
	<-gone
	testwait.Until(t, 5*time.Second, "the gone request out of the queue", func() (bool, string) {
		return h.gw.Queued()["chat"] == 1, fmt.Sprintf("queued %v", h.gw.Queued())
	})
	if tag := g.next(t); tag != "later" {
		t.Errorf("after the first ended, %q reached the engine, want later", tag)
	}
	g.open()
	for _, c := range []<-chan answer{first, later} {
		if a := <-c; a.status != 200 {
			t.Errorf("answer %d %s", a.status, a.body)
		}
	}
	if n := g.hits.Load(); n != 2 {
		t.Errorf("%d requests reached the engine, want 2", n)
	}
}

// A stopping gateway answers what waits 503 node_stopping with
// Retry-After, and what it had sent finishes.
func TestQueueDrainAnswers503(t *testing.T) {
	h, g, first := queueHarness(t, queueConfig())
	waiting := h.queued(1, "second")
	h.gw.Drain()
	a := answerWithin(t, waiting)
	if e := a.apiError(t); a.status != 503 || e.Error.Code != codeStopping || a.header.Get("Retry-After") == "" {
		t.Errorf("queued when the gateway stops: %d %+v", a.status, e)
	}
	if a := h.post("/v1/chat/completions", taggedChat("third")); a.status != 503 {
		t.Errorf("arriving to a full replica while stopping: %d %s, want 503", a.status, a.body)
	}
	g.open()
	if a := <-first; a.status != 200 {
		t.Errorf("the request in flight: %d %s", a.status, a.body)
	}
}

// A priority header the operator allows must name a class: 400 naming the
// header and the classes. A header the operator did not allow is ignored.
func TestPriorityHeader(t *testing.T) {
	u := newUpstream(t, chatOK)
	h := newHarness(t, queueConfig(), boundedChat(4, u.URL).snapshot())
	a := h.post("/v1/chat/completions", chatBody("chat", false), "X-Priority", "urgent")
	if e := a.apiError(t); a.status != 400 || e.Error.Code != "invalid_priority" || !strings.Contains(e.Error.Message, "X-Priority") ||
		!strings.Contains(e.Error.Message, "interactive, default or batch") {
		t.Errorf("a bad class: %d %+v", a.status, e)
	}
	if a := h.post("/v1/chat/completions", chatBody("chat", false), "X-Priority", " Batch "); a.status != 200 {
		t.Errorf("a good class: %d %s", a.status, a.body)
	}
	if u.hits.Load() != 1 {
		t.Errorf("engine saw %d requests, want 1 (not the refused one)", u.hits.Load())
	}
	open := newHarness(t, Config{}, boundedChat(4, u.URL).snapshot())
	if a := open.post("/v1/chat/completions", chatBody("chat", false), "X-Priority", "urgent"); a.status != 200 {
		t.Errorf("with no header allowed: %d %s", a.status, a.body)
	}
}

// answerWithin is the answer on c, failing the test if none comes in 5 s.
func answerWithin(t *testing.T, c <-chan answer) answer {
	t.Helper()
	select {
	case a := <-c:
		return a
	case <-time.After(5 * time.Second): // real time: a bound on a wait that should not happen
		t.Fatal("no answer within 5s")
	}
	return answer{}
}

// The keys file's priority=: a class, or an error naming the file, the
// line and the classes.
func TestKeysPriority(t *testing.T) {
	ks, err := ParseKeys(strings.NewReader("sk-team-a-aaaaaaaaaaaa a priority=interactive\nsk-team-b-bbbbbbbbbbbb concurrency=2 priority=batch\nsk-team-c-cccccccccccc\n"))
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]Priority{"sk-team-a-aaaaaaaaaaaa": PriorityInteractive, "sk-team-b-bbbbbbbbbbbb": PriorityBatch, "sk-team-c-cccccccccccc": PriorityDefault} {
		if k := ks.find(key); k == nil || k.class != want {
			t.Errorf("%s: %+v, want class %s", key, k, want)
		}
	}
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte("# keys\nsk-team-a-aaaaaaaaaaaa a priority=urgent\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadKeys(path)
	if err == nil || !strings.Contains(err.Error(), path+": line 2: priority=urgent: want interactive, default or batch") {
		t.Errorf("bad priority: %v", err)
	}
}
