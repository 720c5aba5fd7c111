package fakeengine

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/llmgw/llmgw/internal/testwait"
)

// recorder is a Sleep that returns at once, noting every delay asked for.
type recorder struct {
	mu  sync.Mutex
	got []time.Duration
}

func (r *recorder) Sleep(ctx context.Context, d time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, d)
	return true
}

func (r *recorder) take() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.got
	r.got = nil
	return out
}

// gate is a Sleep that holds every delay until the test lets it pass, so a
// test decides when each prefill and token step ends.
type gate struct{ calls chan held }

type held struct {
	d    time.Duration
	pass chan struct{}
}

func newGate() *gate { return &gate{calls: make(chan held)} }

func (g *gate) Sleep(ctx context.Context, d time.Duration) bool {
	h := held{d: d, pass: make(chan struct{})}
	select {
	case g.calls <- h:
	case <-ctx.Done():
		return false
	}
	select {
	case <-h.pass:
		return true
	case <-ctx.Done():
		return false
	}
}

// next is the next delay asked for.
func (g *gate) next(t *testing.T) held {
	t.Helper()
	select {
	case h := <-g.calls:
		return h
	case <-time.After(10 * time.Second):
		t.Fatal("no delay asked for within 10s")
		return held{}
	}
}

// completion posts a completions request and returns its usage.
func completion(t *testing.T, url, prompt string, maxTokens int) usage {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true})
	code, _, resp := post(t, url+"/v1/completions", string(body))
	var r struct {
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal([]byte(resp), &r); err != nil || code != 200 {
		t.Fatalf("code %d body %s: %v", code, resp, err)
	}
	return r.Usage
}

// async posts in the background; wait collects the status codes.
type async struct {
	wg    sync.WaitGroup
	mu    sync.Mutex
	codes []int
}

func (a *async) post(ctx context.Context, url, body string) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		code := 0
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			code = resp.StatusCode
		}
		a.mu.Lock()
		a.codes = append(a.codes, code)
		a.mu.Unlock()
	}()
}

func (a *async) wait() []int { a.wg.Wait(); return a.codes }

// A prompt that shares its first blocks with one computed before computes
// only the rest: the prefill asked for is exactly the uncached tokens', and
// the cache counters say how many tokens were looked up and found.
func TestPrefixCacheCutsPrefill(t *testing.T) {
	rec := &recorder{}
	// One millisecond per token makes the prefill read as a token count.
	ts, _ := newTestServer(t, Config{Model: "m", PrefillPer1KTokens: time.Second, Sleep: rec.Sleep})
	system := strings.Repeat("You are a helpful assistant. ", 20) // 580 characters
	chat := func(question string) usage {
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": question}}})
		code, _, resp := post(t, ts.URL+"/v1/chat/completions", string(body))
		var r struct{ Usage usage }
		if err := json.Unmarshal([]byte(resp), &r); err != nil || code != 200 {
			t.Fatalf("code %d body %s: %v", code, resp, err)
		}
		return r.Usage
	}
	// "system\n" + 580 + "\nuser\n" = 593 shared characters, 9 full
	// blocks of 64 (16 tokens of 4).
	first := chat("What is the capital of France?")
	second := chat("How far away is the Moon?")
	if d := rec.take(); len(d) != 2 || d[0] != time.Duration(first.PromptTokens)*time.Millisecond ||
		d[1] != time.Duration(second.PromptTokens-9*16)*time.Millisecond {
		t.Fatalf("prefills %v; want %d ms (cold) then %d ms (9 blocks cached)", d, first.PromptTokens, second.PromptTokens-9*16)
	}
	fams := scrape(t, ts.URL)
	if q, h := value(t, fams, MetricPrefixCacheQueries, "m"), value(t, fams, MetricPrefixCacheHits, "m"); q != float64(first.PromptTokens+second.PromptTokens) || h != 9*16 {
		t.Errorf("queries %v hits %v; want %d and 144", q, h, first.PromptTokens+second.PromptTokens)
	}
	// The same prompt again is cached but for its last, partial block.
	third := chat("How far away is the Moon?")
	if d := rec.take(); len(d) != 1 || d[0] != time.Duration(third.PromptTokens-(third.PromptTokens-1)/16*16)*time.Millisecond {
		t.Errorf("repeated prompt of %d tokens: prefill %v", third.PromptTokens, d)
	}
}

// With the prefix cache off nothing is looked up and every prompt is
// computed whole.
func TestNoPrefixCaching(t *testing.T) {
	rec := &recorder{}
	ts, _ := newTestServer(t, Config{Model: "m", PrefillPer1KTokens: time.Second, NoPrefixCaching: true, Sleep: rec.Sleep})
	p := strings.Repeat("x", 400)
	a, b := completion(t, ts.URL, p, 1), completion(t, ts.URL, p, 1)
	if d := rec.take(); len(d) != 2 || d[0] != 100*time.Millisecond || d[1] != 100*time.Millisecond || a.PromptTokens != 100 || b.PromptTokens != 100 {
		t.Errorf("prefills %v, usage %+v %+v; want 100 ms twice for 100 tokens", d, a, b)
	}
	if v := value(t, scrape(t, ts.URL), MetricPrefixCacheQueries, "m"); v != 0 {
		t.Errorf("queries %v with the cache off", v)
	}
}

// The cache holds at most KVCacheBlocks blocks and evicts the least
// recently used, ends of prompts first: an old prompt then hits on the
// part of its prefix still held.
func TestPrefixCacheEvictsLeastRecentlyUsed(t *testing.T) {
	rec := &recorder{}
	ts, s := newTestServer(t, Config{Model: "m", KVCacheBlocks: 4, PrefillPer1KTokens: time.Second, Sleep: rec.Sleep})
	a, b := strings.Repeat("a", 64*3+1), strings.Repeat("b", 64*2+1) // 3 and 2 full blocks
	completion(t, ts.URL, a, 1)
	completion(t, ts.URL, b, 1)
	if n := s.cache.len(); n != 4 {
		t.Fatalf("%d blocks cached, want the bound 4", n)
	}
	rec.take()
	completion(t, ts.URL, a, 1) // b pushed out a's last block: 2 of 3 hit
	completion(t, ts.URL, b, 1) // a's return pushed out b's last block: 1 of 2 hit
	if d := rec.take(); len(d) != 2 || d[0] != (49-32)*time.Millisecond || d[1] != (33-16)*time.Millisecond {
		t.Errorf("prefills %v; want 17 ms twice (a: 2 of 3 blocks held, b: 1 of 2)", d)
	}
	if n := s.cache.len(); n != 4 {
		t.Errorf("%d blocks cached, want the bound 4", n)
	}
}

// The LRU against a reference model: random inserts and lookups never
// hold more than the bound, and a lookup finds exactly the leading blocks
// the reference still holds.
func TestPrefixCacheMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		capacity := rapid.IntRange(1, 8).Draw(t, "capacity")
		c := newPrefixCache(capacity)
		var ref []uint64 // most recent first
		touch := func(h uint64) {
			for i, x := range ref {
				if x == h {
					ref = append(ref[:i], ref[i+1:]...)
					break
				}
			}
			ref = append([]uint64{h}, ref...)
		}
		has := func(h uint64) bool {
			for _, x := range ref {
				if x == h {
					return true
				}
			}
			return false
		}
		chain := rapid.SliceOfN(rapid.Uint64Range(0, 12), 0, 6)
		for i := range rapid.IntRange(1, 30).Draw(t, "steps") {
			hs := chain.Draw(t, fmt.Sprint("chain", i))
			if rapid.Bool().Draw(t, fmt.Sprint("insert", i)) {
				c.insert(hs)
				for j := len(hs) - 1; j >= 0; j-- {
					touch(hs[j])
				}
				if len(ref) > capacity {
					ref = ref[:capacity]
				}
			} else {
				want := 0
				for want < len(hs) && has(hs[want]) {
					want++
				}
				if got := c.match(hs, len(hs)); got != want {
					t.Fatalf("match(%v) = %d, want %d (held %v)", hs, got, want, ref)
				}
				for j := want - 1; j >= 0; j-- {
					touch(hs[j])
				}
			}
			if c.len() != len(ref) || c.len() > capacity {
				t.Fatalf("cache holds %d, reference %d, bound %d", c.len(), len(ref), capacity)
			}
		}
	})
}

// POST /reset_prefix_cache empties the cache (without the API key, as in
// vLLM, whose key guards /v1 only); other methods are refused.
func TestResetPrefixCache(t *testing.T) {
	rec := &recorder{}
	ts, _ := newTestServer(t, Config{Model: "m", APIKey: "k", PrefillPer1KTokens: time.Second, Sleep: rec.Sleep})
	p := strings.Repeat("z", 64*4)
	send := func() {
		code, _ := do(t, "POST", ts.URL+"/v1/completions", "Bearer k", `{"model":"m","prompt":"`+p+`","max_tokens":1}`)
		if code != 200 {
			t.Fatalf("completion: %d", code)
		}
	}
	send()
	send()
	if code, _ := do(t, "POST", ts.URL+"/reset_prefix_cache", "", ""); code != 200 {
		t.Fatalf("reset: %d, want 200", code)
	}
	send()
	if d := rec.take(); len(d) != 3 || d[0] != 64*time.Millisecond || d[1] != 16*time.Millisecond || d[2] != 64*time.Millisecond {
		t.Errorf("prefills %v; want 64 ms cold, 16 ms warm, 64 ms after the reset", d)
	}
	if code, _ := do(t, "GET", ts.URL+"/reset_prefix_cache", "", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("GET reset: %d, want 405", code)
	}
}

// With max-num-seqs N, N+k requests at once run N and queue k (both in the
// gauges), and the queue is served in arrival order.
func TestQueueIsFirstComeFirstServed(t *testing.T) {
	g := newGate()
	ts, _ := newTestServer(t, Config{Model: "m", MaxRunning: 2, PrefillPer1KTokens: time.Second, NoPrefixCaching: true, Sleep: g.Sleep})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var a async
	// Each prompt's length names it: request i has 10*(i+1) tokens, so
	// its prefill is 10*(i+1) ms (the cache is off: the prompts share
	// their prefixes).
	send := func(i int) {
		a.post(ctx, ts.URL+"/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1}`, strings.Repeat("q", 40*(i+1))))
	}
	gauges := func() (float64, float64) {
		fams := scrape(t, ts.URL)
		return value(t, fams, MetricRunning, "m"), value(t, fams, MetricWaiting, "m")
	}
	send(0)
	send(1)
	running := []held{g.next(t), g.next(t)}
	for i := 2; i < 5; i++ {
		send(i)
		// One at a time, so the arrival order is known.
		testwait.Until(t, 10*time.Second, fmt.Sprintf("request %d queued", i), func() (bool, string) {
			r, w := gauges()
			return r == 2 && w == float64(i-1), fmt.Sprintf("running %v waiting %v", r, w)
		})
	}
	// One place frees at a time, so each next prefill is the one let in.
	close(running[0].pass)
	w1 := g.next(t)
	close(running[1].pass)
	w2 := g.next(t)
	close(w1.pass)
	w3 := g.next(t)
	close(w2.pass)
	close(w3.pass)
	order := []time.Duration{w1.d, w2.d, w3.d}
	if want := []time.Duration{30 * time.Millisecond, 40 * time.Millisecond, 50 * time.Millisecond}; fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("queued requests ran with prefills %v, want %v (arrival order)", order, want)
	}
	for _, c := range a.wait() {
		if c != 200 {
			t.Errorf("status %d", c)
		}
	}
	if r, w := gauges(); r != 0 || w != 0 {
		t.Errorf("running %v waiting %v after all finished", r, w)
	}
}

// A client that leaves the queue is taken off it, and the ones behind it
// move up.
func TestQueueForgetsClientsThatLeave(t *testing.T) {
	g := newGate()
	ts, _ := newTestServer(t, Config{Model: "m", MaxRunning: 1, PrefillBase: time.Millisecond, Sleep: g.Sleep})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leave, cancelLeave := context.WithCancel(ctx)
	var a async
	a.post(ctx, ts.URL+"/v1/completions", `{"model":"m","prompt":"first"}`)
	first := g.next(t)
	a.post(leave, ts.URL+"/v1/completions", `{"model":"m","prompt":"second"}`)
	testwait.Until(t, 10*time.Second, "the second queued", func() (bool, string) {
		w := value(t, scrape(t, ts.URL), MetricWaiting, "m")
		return w == 1, fmt.Sprint("waiting ", w)
	})
	cancelLeave()
	testwait.Until(t, 10*time.Second, "the queue empty again", func() (bool, string) {
		w := value(t, scrape(t, ts.URL), MetricWaiting, "m")
		return w == 0, fmt.Sprint("waiting ", w)
	})
	close(first.pass)
	a.wait()
	if r := value(t, scrape(t, ts.URL), MetricRunning, "m"); r != 0 {
		t.Errorf("running %v after the first finished and the second left", r)
	}
}

// KV-cache usage is the blocks the running sequences hold for their
// prompts and generated tokens, and falls back to 0 when they finish.
func TestKVUsageFollowsTokensInFlight(t *testing.T) {
	g := newGate()
	ts, _ := newTestServer(t, Config{Model: "m", KVCacheBlocks: 100, PrefillBase: time.Second, TokenDelay: time.Millisecond, Sleep: g.Sleep})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kv := func() float64 { return value(t, scrape(t, ts.URL), MetricKVCache, "m") }
	var a async
	// Two prompts of 48 tokens: 3 blocks each.
	for range 2 {
		a.post(ctx, ts.URL+"/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":3,"ignore_eos":true}`, strings.Repeat("k", 192)))
	}
	p1, p2 := g.next(t), g.next(t)
	if p1.d != time.Second || p2.d != time.Second {
		t.Fatalf("prefills %v %v", p1.d, p2.d)
	}
	if u := kv(); u != 0.06 {
		t.Errorf("usage %v while both prefill, want 6 of 100 blocks", u)
	}
	// The first token makes 49: a fourth block.
	close(p1.pass)
	step := g.next(t)
	if step.d != time.Millisecond {
		t.Fatalf("decode step %v", step.d)
	}
	if u := kv(); u != 0.07 {
		t.Errorf("usage %v after one sequence's first token, want 7 of 100", u)
	}
	close(p2.pass)
	close(step.pass)
	for range 3 {
		close(g.next(t).pass)
	}
	a.wait()
	if u := kv(); u != 0 {
		t.Errorf("usage %v after both finished, want 0", u)
	}
}

// ignore_eos with max_tokens fixes the output length, as benchmarks use it,
// and usage and the counters agree with what was sent.
func TestIgnoreEOSFixesOutputLength(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m"})
	u := completion(t, ts.URL, strings.Repeat("w", 40), 50)
	if u != (usage{PromptTokens: 10, CompletionTokens: 50, TotalTokens: 60}) {
		t.Errorf("usage %+v, want 10 + 50", u)
	}
	fams := scrape(t, ts.URL)
	if p, g := value(t, fams, MetricPromptTokens, "m"), value(t, fams, MetricGenerationTokens, "m"); p != 10 || g != 50 {
		t.Errorf("counters %v and %v, want 10 and 50", p, g)
	}
}

// The counters move only with requests the engine computes: probes,
// scrapes, refused and misrouted requests leave them alone.
func TestCountersMoveOnlyWithRequests(t *testing.T) {
	ts, _ := newTestServer(t, Config{Model: "m"})
	counters := func() []float64 {
		fams := scrape(t, ts.URL)
		var out []float64
		for _, n := range []string{MetricPromptTokens, MetricGenerationTokens, MetricPrefixCacheQueries, MetricPrefixCacheHits} {
			out = append(out, value(t, fams, n, "m"))
		}
		return out
	}
	get(t, ts.URL+"/health")
	get(t, ts.URL+"/v1/models")
	post(t, ts.URL+"/v1/completions", `{"model":"other","prompt":"x"}`)
	post(t, ts.URL+"/v1/completions", `{"model":"m"}`)
	post(t, ts.URL+"/reset_prefix_cache", "")
	if c := counters(); fmt.Sprint(c) != "[0 0 0 0]" {
		t.Fatalf("counters %v without a served request", c)
	}
	u := completion(t, ts.URL, strings.Repeat("c", 80), 4)
	if c := counters(); fmt.Sprint(c) != fmt.Sprint([]float64{float64(u.PromptTokens), float64(u.CompletionTokens), float64(u.PromptTokens), 0}) {
		t.Errorf("counters %v after one request with usage %+v", c, u)
	}
}

// Negative knobs are refused with the flag that sets them named.
func TestNegativeKnobsRefused(t *testing.T) {
	for flag, cfg := range map[string]Config{
		"--max-num-seqs":          {Model: "m", MaxRunning: -1},
		"--prefill-per-1k-tokens": {Model: "m", PrefillPer1KTokens: -time.Second},
		"--block-size":            {Model: "m", BlockSize: -16},
	} {
		if _, err := NewServer(cfg); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s negative: error %v, want one naming it", flag, err)
		}
	}
}
