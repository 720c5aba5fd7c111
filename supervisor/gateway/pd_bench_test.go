package gateway

// Why prefill/decode disaggregation is worth it, on fake engines with the
// step model on (fakeengine.Config.StepInterference: a prefill of T tokens
// delays every running decode's next token by T × the per-token prefill
// time, as a real engine's shared forward steps do):
//
//	go test -run '^$' -bench PDStepInterference -benchtime 3x ./supervisor/gateway/
//
// Two GPUs either way: aggregated, two replicas that each prefill and
// decode; disaggregated, one prefill and one decode replica (vLLM's
// protocol, the KV over the fake's side channel). The workload, the same
// for both: pdDecoders clients keep streams of pdDecodeTokens tokens
// going (short prompts), while a long prompt (pdLongTokens tokens, a
// couple of tokens out) arrives every pdLongEvery. Each b.N iteration runs
// one round of each, in turn, for pdRound; the reported figures are the
// medians over rounds of each round's percentiles: the decode streams'
// inter-token latency (p50, p99) and time to first token, and the long
// prompts' time to first token, with the disaggregated/aggregated ratio.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/fakeengine"
)

const (
	pdRound        = 6 * time.Second
	pdDecoders     = 4
	pdDecodeTokens = 64
	pdLongTokens   = 4000
	pdLongEvery    = 400 * time.Millisecond
	pdTokenDelay   = 20 * time.Millisecond
	pdPrefillPer1K = 100 * time.Millisecond
)

// pdBenchEngine starts a fake engine of deployment pd with the step model
// on, taking part in vLLM's protocol when nixl is set.
func pdBenchEngine(b *testing.B, nixl bool, id string) (string, func()) {
	cfg := fakeengine.Config{Model: "pd", TokenDelay: pdTokenDelay, PrefillPer1KTokens: pdPrefillPer1K, StepInterference: true}
	var ln net.Listener
	if nixl {
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			b.Fatal(err)
		}
		cfg.KV = fakeengine.KVTransfer{Connector: "NixlConnector", Role: "kv_both", EngineID: id, SideChannelHost: "127.0.0.1", Listener: ln,
			TransferPer1KTokens: fakeengine.DefaultKVTransferPer1K}
	}
	s, err := fakeengine.NewServer(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(s)
	return ts.URL, func() { ts.Close(); s.Close() }
}

// pdBenchGateway is a gateway in front of two engines, as two replicas
// of one role-less deployment or as a prefill and a decode replica.
func pdBenchGateway(b *testing.B, disaggregated bool) (string, func()) {
	u1, stop1 := pdBenchEngine(b, disaggregated, "engine-1")
	u2, stop2 := pdBenchEngine(b, disaggregated, "engine-2")
	w := newWorld()
	w.ttl = time.Hour
	w.node("n1", gossip.StateAlive)
	w.node("n2", gossip.StateAlive)
	if disaggregated {
		w.deploy(placement.Deployment{Name: "pd", Prefill: &placement.Role{Replicas: 1}, Decode: &placement.Role{Replicas: 1}})
		w.hold(cp{dep: "pd", role: placement.RolePrefill, node: "n1", url: u1})
		w.hold(cp{dep: "pd", role: placement.RoleDecode, node: "n2", url: u2})
	} else {
		w.deploy(placement.Deployment{Name: "pd", Replicas: 2})
		w.hold(cp{dep: "pd", replica: 0, node: "n1", url: u1})
		w.hold(cp{dep: "pd", replica: 1, node: "n2", url: u2})
	}
	// Least load: the prompts share no prefix, and the comparison is of
	// the engines' steps, not of the policy.
	gw := New(Config{Policy: &LeastLoad{}})
	gw.Update(w.snapshotAt(time.Now()))
	gs := httptest.NewServer(gw)
	return gs.URL, func() {
		gs.Close()
		_ = gw.Shutdown(context.Background())
		stop1()
		stop2()
	}
}

// pdRoundStats is one round's measurements.
type pdRoundStats struct {
	mu       sync.Mutex
	itl      []time.Duration // gaps between a decode stream's tokens
	ttft     []time.Duration // the decode streams' first tokens
	longTTFT []time.Duration // the long prompts' first tokens
	errs     int
}

// pdStream sends one streamed chat and records its token times.
func pdStream(client *http.Client, url, content string, tokens int) (ttft time.Duration, gaps []time.Duration, err error) {
	body := fmt.Sprintf(`{"model":"pd","stream":true,"max_tokens":%d,"min_tokens":%d,"messages":[{"role":"user","content":%q}]}`, tokens, tokens, content)
	start := time.Now()
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, nil, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var last time.Time
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") || line == "data: [DONE]" || !strings.Contains(line, `"content"`) {
			continue
		}
		now := time.Now()
		if last.IsZero() {
			ttft = now.Sub(start)
		} else {
			gaps = append(gaps, now.Sub(last))
		}
		last = now
	}
	return ttft, gaps, sc.Err()
}

// pdRun runs one round against a gateway. round makes its prompts its
// own: an engine's prefix cache must not serve a later round's prompts.
func pdRun(url string, round int) *pdRoundStats {
	st := &pdRoundStats{}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: time.Minute}
	defer client.CloseIdleConnections()
	end := time.Now().Add(pdRound)
	var wg sync.WaitGroup
	for i := range pdDecoders {
		wg.Go(func() {
			for n := 0; time.Now().Before(end); n++ {
				ttft, gaps, err := pdStream(client, url, fmt.Sprintf("round %d, decoder %d, stream %d: tell me a story", round, i, n), pdDecodeTokens)
				st.mu.Lock()
				if err != nil {
					st.errs++
				} else {
					st.ttft = append(st.ttft, ttft)
					st.itl = append(st.itl, gaps...)
				}
				st.mu.Unlock()
			}
		})
	}
	long := strings.Repeat("word ", pdLongTokens*4/5) // about four bytes a token
	tick := time.NewTicker(pdLongEvery)
	for n := 0; time.Now().Before(end); n++ {
		wg.Go(func() {
			ttft, _, err := pdStream(client, url, fmt.Sprintf("round %d, document %d: %s", round, n, long), 2)
			st.mu.Lock()
			if err != nil {
				st.errs++
			} else {
				st.longTTFT = append(st.longTTFT, ttft)
			}
			st.mu.Unlock()
		})
		<-tick.C
	}
	tick.Stop()
	wg.Wait()
	return st
}

func pdPct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func BenchmarkPDStepInterference(b *testing.B) {
	type figures struct{ itl50, itl99, ttft50, long50 []float64 }
	var agg, dis figures
	add := func(f *figures, st *pdRoundStats) {
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		f.itl50 = append(f.itl50, ms(pdPct(st.itl, .5)))
		f.itl99 = append(f.itl99, ms(pdPct(st.itl, .99)))
		f.ttft50 = append(f.ttft50, ms(pdPct(st.ttft, .5)))
		f.long50 = append(f.long50, ms(pdPct(st.longTTFT, .5)))
	}
	aggURL, stopAgg := pdBenchGateway(b, false)
	defer stopAgg()
	disURL, stopDis := pdBenchGateway(b, true)
	defer stopDis()
	b.ResetTimer()
	for i := range b.N {
		// In turn, the first variant alternating, so drift falls on both.
		order := []bool{false, true}
		if i%2 == 1 {
			order = []bool{true, false}
		}
		for _, d := range order {
			if d {
				st := pdRun(disURL, i)
				if st.errs > 0 {
					b.Fatalf("disaggregated: %d requests failed", st.errs)
				}
				add(&dis, st)
			} else {
				st := pdRun(aggURL, i)
				if st.errs > 0 {
					b.Fatalf("aggregated: %d requests failed", st.errs)
				}
				add(&agg, st)
			}
		}
	}
	med := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for _, m := range []struct {
		name     string
		agg, dis []float64
	}{
		{"itl-p50", agg.itl50, dis.itl50},
		{"itl-p99", agg.itl99, dis.itl99},
		{"decode-ttft-p50", agg.ttft50, dis.ttft50},
		{"long-ttft-p50", agg.long50, dis.long50},
	} {
		a, d := med(m.agg), med(m.dis)
		b.ReportMetric(a, "agg-"+m.name+"-ms")
		b.ReportMetric(d, "pd-"+m.name+"-ms")
		if a > 0 {
			b.ReportMetric(d/a, "pd/agg-"+m.name)
		}
	}
}
