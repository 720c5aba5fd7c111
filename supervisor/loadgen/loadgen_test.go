package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/supervisor/fakeengine"
)

// Every test stops the servers and clients it started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// engines starts n fake engines of model "m".
func engines(t *testing.T, n int, cfg fakeengine.Config) []*httptest.Server {
	t.Helper()
	var ts []*httptest.Server
	for range n {
		cfg.Model = "m"
		s, err := fakeengine.NewServer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		h := httptest.NewServer(s)
		t.Cleanup(h.Close)
		ts = append(ts, h)
	}
	return ts
}

// roundRobin is a stand-in gateway: it sends request i to backend i mod n
// and names it in the Llmgw-Replica header, as llmgw's gateway does.
func roundRobin(t *testing.T, backends []*httptest.Server) *httptest.Server {
	t.Helper()
	var next atomic.Uint64
	proxies := make([]*httputil.ReverseProxy, len(backends))
	for i, b := range backends {
		u, _ := url.Parse(b.URL)
		p := httputil.NewSingleHostReverseProxy(u)
		p.ModifyResponse = func(r *http.Response) error {
			r.Header.Set(ReplicaHeader, fmt.Sprintf("r%d", i))
			return nil
		}
		proxies[i] = p
	}
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The body is read whole first, as llmgw's gateway reads it: a
		// response relayed while the proxy still streams the client's body
		// upstream would race Go's server discarding that body.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxies[int(next.Add(1)-1)%len(proxies)].ServeHTTP(w, r)
	}))
	t.Cleanup(gw.Close)
	return gw
}

func close2(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestPercentileOnKnownData(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want float64 }{{0, 1}, {50, 5.5}, {90, 9.1}, {99, 9.91}, {100, 10}, {25, 3.25}} {
		if got := Percentile(xs, c.p); !close2(got, c.want) {
			t.Errorf("p%v of 1..10 = %v, want %v", c.p, got, c.want)
		}
	}
	if got := Percentile([]float64{42}, 99); got != 42 {
		t.Errorf("p99 of one value = %v", got)
	}
	if got := Percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("p50 of nothing = %v, want NaN", got)
	}
	s := summarize([]float64{10, 1, 4, 3, 2})
	if !close2(s.Mean, 4) || s.P50 != 3 || !close2(s.P90, 7.6) || !close2(s.P99, 9.76) {
		t.Errorf("summary of 10 1 4 3 2 = %+v, want mean 4, p50 3, p90 7.6, p99 9.76", s)
	}
}

// A closed loop through a round-robin gateway over two engines: every
// request answered, every output token counted, the replicas' shares even,
// and the prompt tokens those the engines counted.
func TestRunCountsTokensAndReplicas(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			ts := engines(t, 2, fakeengine.Config{})
			gw := roundRobin(t, ts)
			w, _ := SharedPrefix(3, 50, 1)
			rep, err := Run(context.Background(), Config{
				URL: gw.URL, Model: "m", Concurrency: 4, Requests: 20, Stream: stream, MaxTokens: 5, Workload: w,
			})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Requests != 20 || rep.Succeeded != 20 || rep.Failed != 0 || len(rep.Errors) != 0 {
				t.Fatalf("report %+v, want 20 answered", rep)
			}
			if rep.OutputTokens != 100 {
				t.Errorf("%d output tokens, want 20 × 5", rep.OutputTokens)
			}
			if want := map[string]int{"r0": 10, "r1": 10}; fmt.Sprint(rep.Replicas) != fmt.Sprint(want) || rep.ReplicaMaxOverMean != 1 {
				t.Errorf("replicas %v max/mean %v, want %v and 1", rep.Replicas, rep.ReplicaMaxOverMean, want)
			}
			counted := 0
			for _, h := range ts {
				counted += promptTokens(t, h.URL)
			}
			if rep.PromptTokens != counted || counted == 0 {
				t.Errorf("%d prompt tokens in the answers' usage, %d counted by the engines", rep.PromptTokens, counted)
			}
			if rep.TTFB.P50 > rep.Latency.P50 || rep.TTFB.P99 > rep.Latency.P99 || rep.Latency.P50 <= 0 {
				t.Errorf("ttfb %+v latency %+v", rep.TTFB, rep.Latency)
			}
			if rep.RequestsPerS <= 0 || !close2(rep.OutputTokensPerS/rep.RequestsPerS, 5) {
				t.Errorf("%v requests/s, %v tokens/s; want 5 tokens a request", rep.RequestsPerS, rep.OutputTokensPerS)
			}
		})
	}
}

// promptTokens reads an engine's vllm:prompt_tokens_total.
func promptTokens(t *testing.T, base string) int {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, fakeengine.MetricPromptTokens+"{") {
			var v float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			return int(v)
		}
	}
	t.Fatalf("no %s in %s", fakeengine.MetricPromptTokens, b)
	return 0
}

// With a rate, the gaps between starts are the seeded exponential draws.
func TestPoissonArrivalsFollowTheSeed(t *testing.T) {
	ts := engines(t, 1, fakeengine.Config{})
	// A clock that only sleeping moves: each sleep is then exactly the
	// gap to the next arrival.
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	var gaps []time.Duration
	sleep := func(ctx context.Context, d time.Duration) bool {
		mu.Lock()
		defer mu.Unlock()
		gaps = append(gaps, d)
		now = now.Add(d)
		return true
	}
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	rep, err := Run(context.Background(), Config{
		URL: ts[0].URL, Model: "m", Rate: 50, Requests: 40, Workload: Unique(1),
		Rand: rand.New(rand.NewPCG(7, 7)), Sleep: sleep, Now: clock,
	})
	if err != nil || rep.Succeeded != 40 {
		t.Fatalf("%+v %v", rep, err)
	}
	ref := rand.New(rand.NewPCG(7, 7))
	var want []time.Duration
	var sum time.Duration
	for range 40 {
		d := time.Duration(ref.ExpFloat64() / 50 * float64(time.Second))
		want, sum = append(want, d), sum+d
	}
	if !slices.Equal(gaps, want) {
		t.Errorf("gaps %v, want the seeded draws %v", gaps, want)
	}
	if mean := sum / 40; mean < 10*time.Millisecond || mean > 40*time.Millisecond {
		t.Errorf("mean gap %v at 50/s; want near 20ms", mean)
	}
	if rep.DurationS != sum.Seconds() {
		t.Errorf("run took %vs by its clock, want the arrivals' %vs", rep.DurationS, sum.Seconds())
	}
}

// Each way a request can fail is counted under its kind.
func TestErrorsByKind(t *testing.T) {
	// The stand-in engine misbehaves as the model name asks.
	odd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Model string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		switch req.Model {
		case "busy":
			http.Error(w, `{"error":{"message":"slow down"}}`, http.StatusTooManyRequests)
		case "aborted":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		case "no-done":
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		case "error-event":
			fmt.Fprint(w, "data: {\"error\":{\"message\":\"engine died\"}}\n\n")
		case "short":
			w.Header().Set("Content-Length", "100")
			fmt.Fprint(w, `{"usage":`)
		case "garbage":
			fmt.Fprint(w, "not json")
		}
	}))
	defer odd.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	for _, c := range []struct {
		name, url, model string
		stream           bool
		kind             string
	}{
		{"nothing listens", closed, "m", false, "connect"},
		{"a status", odd.URL, "busy", false, "http 429"},
		{"connection aborted", odd.URL, "aborted", true, "mid-stream"},
		{"stream without [DONE]", odd.URL, "no-done", true, "mid-stream"},
		{"an error event", odd.URL, "error-event", true, "mid-stream"},
		{"body cut short", odd.URL, "short", false, "mid-stream"},
		{"not OpenAI's shape", odd.URL, "garbage", false, "bad body"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep, err := Run(context.Background(), Config{URL: c.url, Model: c.model, Concurrency: 1, Requests: 3, Stream: c.stream, Workload: Unique(1)})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Failed != 3 || rep.Succeeded != 0 || fmt.Sprint(rep.Errors) != fmt.Sprintf("map[%s:3]", c.kind) {
				t.Errorf("report %+v, want 3 failures of kind %q", rep, c.kind)
			}
		})
	}
	// An engine that does not serve the model answers 404.
	ts := engines(t, 1, fakeengine.Config{})
	rep, _ := Run(context.Background(), Config{URL: ts[0].URL, Model: "other", Concurrency: 2, Requests: 4, Workload: Unique(1)})
	if rep.Errors["http 404"] != 4 {
		t.Errorf("wrong model: errors %v, want 4 × http 404", rep.Errors)
	}
}

// Cancelling the run cuts off the requests in flight, counted as
// canceled, and starts no more.
func TestCancelStopsTheRun(t *testing.T) {
	started := make(chan struct{}, 10)
	hold := func(ctx context.Context, d time.Duration) bool {
		started <- struct{}{}
		<-ctx.Done()
		return false
	}
	ts := engines(t, 1, fakeengine.Config{PrefillBase: time.Hour, Sleep: hold})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Report)
	go func() {
		rep, _ := Run(ctx, Config{URL: ts[0].URL, Model: "m", Concurrency: 2, Requests: 10, Workload: Unique(1)})
		done <- rep
	}()
	<-started
	<-started
	cancel()
	rep := <-done
	if rep.Requests != 2 || rep.Errors["canceled"] != 2 {
		t.Errorf("report %+v, want the 2 in flight canceled and no more sent", rep)
	}
}

// A run with a duration stops starting requests when it is over and waits
// for the ones in flight.
func TestDurationEndsTheRun(t *testing.T) {
	ts := engines(t, 1, fakeengine.Config{PrefillBase: 5 * time.Millisecond})
	rep, err := Run(context.Background(), Config{URL: ts[0].URL, Model: "m", Concurrency: 2, Duration: 100 * time.Millisecond, Workload: Unique(1)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests < 2 || rep.Failed != 0 || rep.DurationS < 0.1 {
		t.Errorf("report %+v; want a few answered requests over at least 100ms", rep)
	}
}

// The shared-prefix workload: a tenant's requests share its system prompt,
// the tenants come in about equal numbers and interleaved, every question
// is unique, and an engine's prefix cache serves all but each tenant's
// first request from cache.
func TestSharedPrefixWorkload(t *testing.T) {
	w, err := SharedPrefix(3, 100, 9)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	perTenant := map[string]int{}
	changes := 0
	for i := range 300 {
		m := w(i)
		if len(m) != 2 || m[0].Role != "system" || m[1].Role != "user" || len(m[0].Content) != 400 {
			t.Fatalf("request %d: %+v", i, m)
		}
		perTenant[m[0].Content]++
		if i > 0 && w(i - 1)[0].Content != m[0].Content {
			changes++
		}
		if seen[m[1].Content] {
			t.Errorf("question %q repeated", m[1].Content)
		}
		seen[m[1].Content] = true
	}
	if len(perTenant) != 3 {
		t.Fatalf("%d distinct system prompts, want 3", len(perTenant))
	}
	for _, n := range perTenant {
		if n < 70 || n > 130 {
			t.Errorf("tenants' shares %v of 300; want about 100 each", slices.Collect(maps.Values(perTenant)))
		}
	}
	// Random draws change tenant two times in three; a cycle would every
	// time.
	if changes < 150 || changes > 250 {
		t.Errorf("the tenant changed %d times in 300 requests; want them interleaved at random (about 200)", changes)
	}
	if again, _ := SharedPrefix(3, 100, 9); again(4)[0].Content != w(4)[0].Content || again(4)[1].Content != w(4)[1].Content {
		t.Error("the workload is not a function of its seed")
	}

	ts := engines(t, 1, fakeengine.Config{})
	if _, err := Run(context.Background(), Config{URL: ts[0].URL, Model: "m", Concurrency: 1, Requests: 30, Workload: w}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(ts[0].URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// "system\n" + 400 + "\nuser\n" = 413 shared characters: 6 blocks of
	// 16 tokens, hit by each request after its tenant's first.
	firsts := map[string]bool{}
	for i := range 30 {
		firsts[w(i)[0].Content] = true
	}
	if want := fmt.Sprintf(`%s{model_name="m"} %d`, fakeengine.MetricPrefixCacheHits, (30-len(firsts))*96); !strings.Contains(string(b), want) {
		t.Errorf("metrics lack %q:\n%s", want, b)
	}
	if _, err := SharedPrefix(0, 10, 1); err == nil {
		t.Error("no tenants accepted")
	}
}

// The report's JSON is the shape scripts read.
func TestReportJSONShape(t *testing.T) {
	var a aggregate
	a.add(result{ttfb: 10 * time.Millisecond, latency: 30 * time.Millisecond, promptTokens: 7, outputTokens: 3, replica: "r0"})
	a.add(result{kind: "http 503", replica: "r1"})
	b, err := json.Marshal(a.report(2 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := `{"duration_s":2,"errors":{"http 503":1},"failed":1,"latency_ms":{"mean":30,"p50":30,"p90":30,"p99":30},` +
		`"output_tokens":3,"output_tokens_per_s":1.5,"prompt_tokens":7,"replica_max_over_mean":1,"replicas":{"r0":1,"r1":1},` +
		`"requests":2,"requests_per_s":0.5,"succeeded":1,"ttfb_ms":{"mean":10,"p50":10,"p90":10,"p99":10}}`
	if again, _ := json.Marshal(got); string(again) != want {
		t.Errorf("JSON\n%s\nwant\n%s", again, want)
	}
}

// A run without what it needs changes nothing and says what is missing.
func TestBadConfigRefused(t *testing.T) {
	ok := Config{URL: "http://x", Model: "m", Concurrency: 1, Requests: 1, Workload: Unique(1)}
	for want, mutate := range map[string]func(*Config){
		"URL":                    func(c *Config) { c.URL = "" },
		"model":                  func(c *Config) { c.Model = " " },
		"workload":               func(c *Config) { c.Workload = nil },
		"concurrency or a rate":  func(c *Config) { c.Concurrency = 0 },
		"rate must not":          func(c *Config) { c.Rate = -1 },
		"requests or a duration": func(c *Config) { c.Requests = 0 },
	} {
		c := ok
		mutate(&c)
		if _, err := Run(context.Background(), c); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v", want, err)
		}
	}
}
