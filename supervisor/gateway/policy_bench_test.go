package gateway

// How well each policy routes, on one cluster in one run:
//
//	go test -run '^$' -bench Policies -benchtime 1x ./supervisor/gateway/
//
// Four fake replicas that behave like engines (50 ms to first token for an
// uncached 1k-token prompt, 10 ms per token, 8 sequences at once, a KV
// cache of 3,072 blocks of 16 tokens that doubles as the prefix cache)
// behind three gateways, each with its own policy instance and its own
// scrapes, as on three nodes. One load generator sends Poisson arrivals
// and spreads them over the gateways it sends to in turn.
//
// Every policy starts on fresh replicas, so no run inherits a warm cache
// from the one before. It then sends 10 s unmeasured to warm its own
// caches, so what is measured is the policy's steady state, not 64 tenants'
// first prefills on every replica; the warm-up's questions are not the
// measured ones.
//
// The workloads: "shared-prefix", 64 tenants with a 1k-token system prompt
// each and a short question of every request's own, interleaved; together
// their system prompts are 4/3 of what one replica's cache holds, so a
// replica that sees every tenant keeps evicting them, and the cache pays
// only when a tenant keeps to few replicas. It runs at two loads: 70
// requests/s (about half of what the replicas can serve) and 100 (about
// 80%), and at 70 through one door: the clients send to one gateway, the
// other two are in the view but idle, as when clients know one node.
// "unique": short questions that share nothing (affinity cannot help; it
// must not hurt), at 100 requests/s.
//
// Reported per policy: time to first byte p50/p90, requests/s, the
// replicas' prefix-cache hit rate, the busiest replica's requests over the
// mean, and the largest excess of any replica's instantaneous load over
// the bound shared-nothing gateways keep, ceil(1.25 x mean) + gateways - 1
// (sampled every 20 ms; at most 0 when the bound holds).

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/load"
	"github.com/llmgw/llmgw/supervisor/fakeengine"
	"github.com/llmgw/llmgw/supervisor/loadgen"
)

const (
	policyReplicas = 4
	policyGateways = 3
	policyDuration = 20 * time.Second
	policyTenants  = 64
	policySystem   = 1000 // system prompt tokens
	policyAnswer   = 20   // tokens per answer
)

var benchScrape = flag.Duration("gwbench.scrape", DefaultScrapeInterval, "the gateways' least scrape interval in BenchmarkPolicies")

var benchBlocks = flag.Int("gwbench.blocks", 3072, "each fake replica's KV cache in blocks of 16 tokens in BenchmarkPolicies")

var benchPolicyRate = flag.Float64("gwbench.rate", 0, "requests/s of every workload of BenchmarkPolicies, over all gateways (0: each workload's own)")

var benchPolicyDuration = flag.Duration("gwbench.duration", policyDuration, "how long BenchmarkPolicies sends for each policy and workload")

var benchWarmup = flag.Duration("gwbench.warmup", 10*time.Second, "how long each policy sends, unmeasured, to fill its own replicas' caches before BenchmarkPolicies measures")

var benchEntries = flag.Int("gwbench.doors", 0, "how many of the gateways the clients send to in every workload of BenchmarkPolicies (0: each workload's own; the others route nothing but are in the view)")

var benchBalance = flag.Float64("gwbench.balance", DefaultBalance, "the prefix policy's load bound in BenchmarkPolicies")

func BenchmarkPolicies(b *testing.B) {
	shared, err := loadgen.SharedPrefix(policyTenants, policySystem, 1)
	if err != nil {
		b.Fatal(err)
	}
	workloads := []struct {
		name  string
		w     loadgen.Workload
		rate  float64 // requests/s over all gateways
		doors int     // how many of the gateways the clients send to
	}{
		{"shared-prefix-70rps", shared, 70, policyGateways},
		{"shared-prefix-100rps", shared, 100, policyGateways},
		{"shared-prefix-70rps-one-door", shared, 70, 1},
		{"unique-100rps", loadgen.Unique(1), 100, policyGateways},
	}
	for _, wl := range workloads {
		if *benchPolicyRate > 0 {
			wl.rate = *benchPolicyRate
		}
		if *benchEntries > 0 {
			wl.doors = min(*benchEntries, policyGateways)
		}
		for _, pol := range []string{"round-robin", "least-load", "prefix"} {
			b.Run(wl.name+"/"+pol, func(b *testing.B) {
				var res policyResult
				for range b.N {
					res = runPolicy(b, pol, wl.w, wl.rate, wl.doors)
				}
				b.ReportMetric(res.rep.TTFB.P50, "ttfb_p50_ms")
				b.ReportMetric(res.rep.TTFB.P90, "ttfb_p90_ms")
				b.ReportMetric(res.rep.RequestsPerS, "req/s")
				b.ReportMetric(res.hitRate, "hit_rate")
				b.ReportMetric(res.rep.ReplicaMaxOverMean, "max/mean")
				b.ReportMetric(res.overBound, "over_bound")
				if pol == "prefix" {
					b.ReportMetric(res.spilled, "spilled")
				}
				b.ReportMetric(float64(res.rep.Failed), "errors")
			})
		}
	}
}

type policyResult struct {
	rep       loadgen.Report
	hitRate   float64
	overBound float64
	spilled   float64
}

func runPolicy(b *testing.B, policy string, w loadgen.Workload, rate float64, doors int) policyResult {
	b.Helper()
	var engines []*httptest.Server
	var urls []string
	for range policyReplicas {
		srv, err := fakeengine.NewServer(fakeengine.Config{Model: "chat", PrefillPer1KTokens: 50 * time.Millisecond,
			TokenDelay: 10 * time.Millisecond, MaxRunning: 8, KVCacheBlocks: *benchBlocks})
		if err != nil {
			b.Fatal(err)
		}
		e := httptest.NewServer(srv)
		defer e.Close()
		engines = append(engines, e)
		urls = append(urls, e.URL)
	}
	world := newWorld()
	world.deploy(placement.Deployment{Name: "chat", Replicas: policyReplicas})
	node := func(i int) string { return fmt.Sprintf("n%d", i+1) }
	for i, u := range urls {
		world.node(node(i), "alive")
		world.hold(cp{dep: "chat", replica: i, node: node(i), url: u})
	}
	// Gateway i runs on node i and publishes its rates there, as nodes do.
	for i := range policyGateways {
		r := world.members[node(i)].Record
		r.Gateway, r.GatewayRates = fmt.Sprintf("127.0.0.1:%d", 8000+i), map[string]float64{}
	}
	var gws []*url.URL
	var gateways []*Gateway
	for range policyGateways {
		p, err := NewPolicy(policy, 0, *benchBalance)
		if err != nil {
			b.Fatal(err)
		}
		gw := New(Config{Policy: p, ScrapeInterval: *benchScrape})
		gw.Update(world.snapshotOf(node(len(gateways)), time.Now()))
		gateways = append(gateways, gw)
		srv := httptest.NewServer(gw)
		defer func() {
			srv.Close()
			_ = gw.Shutdown(context.Background())
		}()
		u, _ := url.Parse(srv.URL)
		gws = append(gws, u)
	}
	// The snapshot's leases were judged at its making; keep the view fresh
	// for a run longer than a lease, and carry each gateway's rates to the
	// others every second. Unlike the nodes' records, every second and
	// unrounded: the node's republication rule (publish.Load) is not
	// part of what this measures.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			for i, gw := range gateways {
				world.members[node(i)].Record.GatewayRates = gw.Rates()
			}
			for i, gw := range gateways {
				gw.Update(world.snapshotOf(node(i), time.Now()))
			}
		}
	})
	// One generator, its requests spread over the doors in turn.
	var next atomic.Uint64
	rotate := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		g := gws[next.Add(1)%uint64(doors)]
		r = r.Clone(r.Context())
		r.URL.Scheme, r.URL.Host, r.Host = g.Scheme, g.Host, g.Host
		return http.DefaultTransport.RoundTrip(r)
	})
	send := func(d time.Duration, w loadgen.Workload, seed uint64) loadgen.Report {
		rep, err := loadgen.Run(context.Background(), loadgen.Config{URL: "http://gateways", Model: "chat", Rate: rate,
			Duration: d, Stream: true, MaxTokens: policyAnswer, Workload: w, Rand: rand.New(rand.NewPCG(seed, 2)),
			Client: &http.Client{Transport: rotate}})
		if err != nil {
			b.Fatal(err)
		}
		return rep
	}
	// The warm-up fills the policy's own caches from empty, so the
	// measurement is of its steady state rather than of 64 tenants' first
	// prefills on each replica. Its questions are not the measured ones,
	// which must miss.
	if *benchWarmup > 0 {
		send(*benchWarmup, func(i int) []loadgen.Message { return w(i + 1<<30) }, 3)
	}
	var hits0, queries0 float64
	for _, e := range engines {
		s := scrapeEngine(b, e.URL)
		hits0 += s.PrefixHits
		queries0 += s.PrefixQueries
	}
	affinity := func() (taken, spilled float64) {
		for _, gw := range gateways {
			taken += value(b, gw.m.affinity.WithLabelValues("chat", string(AffinityTaken)))
			spilled += value(b, gw.m.affinity.WithLabelValues("chat", string(AffinitySpilled)))
		}
		return taken, spilled
	}
	taken0, spilled0 := affinity()

	var over atomic.Uint64 // math.Float64bits of the largest excess seen
	over.Store(math.Float64bits(math.Inf(-1)))
	sampling := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sampling:
				return
			case <-t.C:
			}
			total, most := 0.0, 0.0
			for _, e := range engines {
				s := scrapeEngine(b, e.URL)
				l := s.Running + s.Waiting
				total += l
				most = max(most, l)
			}
			bound := math.Ceil(DefaultBalance*total/policyReplicas) + policyGateways - 1
			if ex := most - bound; total > 0 && ex > math.Float64frombits(over.Load()) {
				over.Store(math.Float64bits(ex))
			}
		}
	})
	rep := send(*benchPolicyDuration, w, 1)
	close(sampling)
	sampler.Wait()
	close(stop)
	wg.Wait()
	var hits, queries float64
	for _, e := range engines {
		s := scrapeEngine(b, e.URL)
		hits += s.PrefixHits
		queries += s.PrefixQueries
	}
	hits, queries = hits-hits0, queries-queries0
	res := policyResult{rep: rep, overBound: math.Float64frombits(over.Load())}
	taken, spilled := affinity()
	taken, spilled = taken-taken0, spilled-spilled0
	if taken+spilled > 0 {
		res.spilled = spilled / (taken + spilled)
	}
	if queries > 0 {
		res.hitRate = hits / queries
	}
	return res
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func scrapeEngine(b *testing.B, base string) load.Sample {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		b.Error(err)
		return load.Sample{}
	}
	defer resp.Body.Close()
	s, err := load.Parse(resp.Body, expfmt.ResponseFormat(resp.Header), load.VLLM())
	if err != nil {
		b.Error(err)
	}
	return s
}
