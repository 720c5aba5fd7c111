package load

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	"github.com/llmgw/llmgw/internal/clock"
)

func page(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func parse(t *testing.T, text string) (Sample, error) {
	t.Helper()
	return Parse(strings.NewReader(text), expfmt.FmtText, VLLM())
}

func TestParseVLLMV1(t *testing.T) {
	s, err := parse(t, page(t, "vllm-v1.txt"))
	if err != nil {
		t.Fatal(err)
	}
	want := Sample{Running: 7, Waiting: 2, KVCacheUsage: 0.4137, PromptTokens: 1875632, GenerationTokens: 402311, StartTime: 1796441722.13}
	if !equalSample(s, want) {
		t.Errorf("sample = %+v, want %+v", s, want)
	}
}

func TestParseDataParallel(t *testing.T) {
	s, err := parse(t, page(t, "vllm-dp.txt"))
	if err != nil {
		t.Fatal(err)
	}
	// Running and waiting add up over engines, counters too; KV usage is
	// the fuller engine's. No start time on this page.
	want := Sample{Running: 21, Waiting: 4, KVCacheUsage: 0.91, PromptTokens: 750000, GenerationTokens: 200000}
	if !equalSample(s, want) {
		t.Errorf("sample = %+v, want %+v", s, want)
	}
}

// Older vLLM only has vllm:gpu_cache_usage_perc.
func TestParseOldKVName(t *testing.T) {
	s, err := parse(t, page(t, "vllm-v0.txt"))
	if err != nil {
		t.Fatal(err)
	}
	want := Sample{Running: 3, Waiting: 0, KVCacheUsage: 0.0873, PromptTokens: 88210, GenerationTokens: 30194, StartTime: 1730112037.51}
	if !equalSample(s, want) {
		t.Errorf("sample = %+v, want %+v", s, want)
	}
}

// Both names present (a vLLM in transition): the new one wins.
func TestParseBothKVNames(t *testing.T) {
	s, err := parse(t, "vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.25\n")
	if err != nil || s.KVCacheUsage != 0.25 {
		t.Errorf("sample = %+v, %v", s, err)
	}
}

func TestParseMissingSomeMetrics(t *testing.T) {
	s, err := parse(t, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
		"vllm:prompt_tokens_total", "vllm:generation_tokens_total"}
	if s.Running != 1 || !slices.Equal(s.Missing, want) {
		t.Errorf("sample = %+v", s)
	}
}

// A reading the page lacks, or the engine has no name for (llama.cpp's KV
// usage), is unknown in the Sample and in the Load: its 0 is no reading.
func TestAbsentReadingsAreUnknownNotZero(t *testing.T) {
	s, err := parse(t, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{UnknownWaiting, UnknownKVCache, UnknownPromptTokens, UnknownGenerationTokens}
	if !slices.Equal(s.Unknown, want) {
		t.Fatalf("unknown %v, want %v", s.Unknown, want)
	}
	l := NewTracker().Observe("e", s)
	if !slices.Equal(l.Unknown, want) {
		t.Fatalf("load's unknown %v, want %v", l.Unknown, want)
	}
	noKVName := VLLM()
	noKVName.KVCache = nil
	full, err := os.ReadFile("testdata/vllm-v1.txt")
	if err != nil {
		t.Fatal(err)
	}
	s, err = Parse(bytes.NewReader(full), expfmt.FmtText, noKVName)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Unknown, []string{UnknownKVCache}) {
		t.Fatalf("no KV name: unknown %v, want [%s]", s.Unknown, UnknownKVCache)
	}
	s, err = Parse(bytes.NewReader(full), expfmt.FmtText, VLLM())
	if err != nil || len(s.Unknown) != 0 {
		t.Fatalf("full page: unknown %v, err %v", s.Unknown, err)
	}
}

func TestParseMalformed(t *testing.T) {
	_, err := parse(t, page(t, "malformed.txt"))
	if err == nil || !strings.Contains(err.Error(), "parse metrics") {
		t.Errorf("err = %v", err)
	}
}

// A page of something else (a Go program's /metrics, an HTML error page
// served as text) is not an engine's.
func TestParseNotAnEngine(t *testing.T) {
	for _, text := range []string{
		"# TYPE go_goroutines gauge\ngo_goroutines 12\nprocess_start_time_seconds 1.7e9\n",
		"",
	} {
		if _, err := parse(t, text); !errors.Is(err, ErrNoMetrics) {
			t.Errorf("%q: err = %v", text, err)
		}
	}
}

// NaN and Inf would make the Load unmarshallable; they count as absent.
func TestParseNonFinite(t *testing.T) {
	s, err := parse(t, "vllm:kv_cache_usage_perc NaN\nvllm:num_requests_running +Inf\nvllm:num_requests_waiting 3\n")
	if err != nil {
		t.Fatal(err)
	}
	if s.KVCacheUsage != 0 || s.Running != 0 || s.Waiting != 3 || !slices.Contains(s.Missing, "vllm:num_requests_running") {
		t.Errorf("sample = %+v", s)
	}
}

func TestParseOpenMetrics(t *testing.T) {
	om := `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 4
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{model_name="m"} 100
vllm:prompt_tokens_created{model_name="m"} 1.7e9
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{model_name="m"} 40
# EOF
`
	s, err := Parse(strings.NewReader(om), expfmt.NewFormat(expfmt.TypeOpenMetrics), VLLM())
	if err != nil {
		t.Fatal(err)
	}
	if s.Running != 4 || s.PromptTokens != 100 || s.GenerationTokens != 40 {
		t.Errorf("sample = %+v", s)
	}
}

func equalSample(a, b Sample) bool {
	near := func(x, y float64) bool { return math.Abs(x-y) <= 1e-9*math.Max(1, math.Abs(y)) }
	return near(a.Running, b.Running) && near(a.Waiting, b.Waiting) && near(a.KVCacheUsage, b.KVCacheUsage) &&
		near(a.PromptTokens, b.PromptTokens) && near(a.GenerationTokens, b.GenerationTokens) &&
		near(a.StartTime, b.StartTime) && a.At.Equal(b.At)
}

func TestScraper(t *testing.T) {
	body := page(t, "vllm-v1.txt")
	var accept string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		accept = r.Header.Get("Accept")
		switch r.URL.Path {
		case "/metrics":
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			_, _ = w.Write([]byte(body))
		case "/big":
			_, _ = w.Write(bytes.Repeat([]byte("# padding\n"), 2000))
		default:
			http.Error(w, "no", http.StatusNotFound)
		}
	}))
	defer srv.Close()
	clk := clock.NewFake(time.Date(2026, 11, 29, 22, 0, 0, 0, time.UTC))
	sc := NewScraper(srv.Client(), clk, WithMaxBytes(10_000))

	s, err := sc.Scrape(context.Background(), srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if accept != "text/plain; version=0.0.4" {
		t.Errorf("Accept = %q", accept)
	}
	if s.Running != 7 || !s.At.Equal(clk.Now()) {
		t.Errorf("sample = %+v", s)
	}

	s, err = sc.Scrape(context.Background(), srv.URL+"/nope")
	if err == nil || !strings.Contains(err.Error(), "404") || !s.At.Equal(clk.Now()) {
		t.Errorf("404: %+v, %v", s, err)
	}
	if _, err = sc.Scrape(context.Background(), srv.URL+"/big"); err == nil || !strings.Contains(err.Error(), "larger than 10000 bytes") {
		t.Errorf("big: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err = sc.Scrape(ctx, srv.URL+"/metrics"); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

// One engine over time: baseline, rates, a restart, rates again.
func TestTracker(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 22, 0, 0, 0, time.UTC)
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	tr := NewTracker()

	l := tr.Observe("e1", Sample{Running: 2, PromptTokens: 1000, GenerationTokens: 500, StartTime: 100, At: at(0)})
	if l.RatesValid || l.PromptTPS != 0 || l.Running != 2 || !l.ScrapedAt.Equal(at(0)) {
		t.Errorf("first = %+v", l)
	}
	l = tr.Observe("e1", Sample{PromptTokens: 6000, GenerationTokens: 1500, StartTime: 100, At: at(5)})
	if !l.RatesValid || l.PromptTPS != 1000 || l.GenerationTPS != 200 {
		t.Errorf("second = %+v", l)
	}
	// Another engine does not disturb e1's baseline.
	if l := tr.Observe("e2", Sample{PromptTokens: 1, At: at(5)}); l.RatesValid {
		t.Errorf("e2 first = %+v", l)
	}
	// Same timestamp: no rate, baseline kept.
	if l := tr.Observe("e1", Sample{PromptTokens: 7000, GenerationTokens: 1600, StartTime: 100, At: at(5)}); l.RatesValid {
		t.Errorf("same instant = %+v", l)
	}
	l = tr.Observe("e1", Sample{PromptTokens: 8000, GenerationTokens: 2500, StartTime: 100, At: at(10)})
	if !l.RatesValid || l.PromptTPS != 400 || l.GenerationTPS != 200 {
		t.Errorf("after same instant = %+v", l)
	}

	// The engine restarted: counters fell. No rate, new baseline.
	l = tr.Observe("e1", Sample{PromptTokens: 300, GenerationTokens: 100, StartTime: 200, At: at(15)})
	if l.RatesValid || l.PromptTPS != 0 || l.GenerationTPS != 0 {
		t.Errorf("restart = %+v", l)
	}
	l = tr.Observe("e1", Sample{PromptTokens: 1300, GenerationTokens: 600, StartTime: 200, At: at(20)})
	if !l.RatesValid || l.PromptTPS != 200 || l.GenerationTPS != 100 {
		t.Errorf("after restart = %+v", l)
	}

	// A restart that served more tokens than before between two scrapes:
	// only the start time shows it.
	l = tr.Observe("e1", Sample{PromptTokens: 50000, GenerationTokens: 9000, StartTime: 300, At: at(25)})
	if l.RatesValid {
		t.Errorf("restart with higher counters = %+v", l)
	}

	// A failed scrape keeps the baseline.
	l = tr.Failed("e1", at(30), errors.New("connection refused"))
	if l.Error != "connection refused" || l.RatesValid || !l.ScrapedAt.Equal(at(30)) {
		t.Errorf("failed = %+v", l)
	}
	l = tr.Observe("e1", Sample{PromptTokens: 51000, GenerationTokens: 9000, StartTime: 300, At: at(35)})
	if !l.RatesValid || l.PromptTPS != 100 {
		t.Errorf("after failure = %+v", l)
	}

	tr.Forget("e1")
	if l := tr.Observe("e1", Sample{PromptTokens: 52000, StartTime: 300, At: at(40)}); l.RatesValid {
		t.Errorf("after Forget = %+v", l)
	}
}

// A counter reset seen through the Scraper: the page goes back to small
// counters with a new start time.
func TestScrapeTrackCounterReset(t *testing.T) {
	pages := []string{
		"process_start_time_seconds 100\nvllm:prompt_tokens_total{engine=\"0\"} 10000\nvllm:generation_tokens_total{engine=\"0\"} 2000\n",
		"process_start_time_seconds 100\nvllm:prompt_tokens_total{engine=\"0\"} 12000\nvllm:generation_tokens_total{engine=\"0\"} 2600\n",
		"process_start_time_seconds 190\nvllm:prompt_tokens_total{engine=\"0\"} 40\nvllm:generation_tokens_total{engine=\"0\"} 0\n",
		"process_start_time_seconds 190\nvllm:prompt_tokens_total{engine=\"0\"} 240\nvllm:generation_tokens_total{engine=\"0\"} 30\n",
	}
	i := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(pages[i]))
	}))
	defer srv.Close()
	clk := clock.NewFake(time.Unix(1000, 0))
	sc := NewScraper(srv.Client(), clk)
	tr := NewTracker()
	var got []Load
	for i = range pages {
		s, err := sc.Scrape(context.Background(), srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, tr.Observe("shard-a", s))
		clk.Advance(2 * time.Second)
	}
	valid := []bool{false, true, false, true}
	prompt := []float64{0, 1000, 0, 100}
	gen := []float64{0, 300, 0, 15}
	for k, l := range got {
		if l.RatesValid != valid[k] || l.PromptTPS != prompt[k] || l.GenerationTPS != gen[k] {
			t.Errorf("scrape %d: %+v", k, l)
		}
		if _, err := json.Marshal(l); err != nil {
			t.Errorf("scrape %d: marshal: %v", k, err)
		}
	}
}

func TestLoadJSON(t *testing.T) {
	b, err := json.Marshal(Load{Running: 1, RatesValid: true, ScrapedAt: time.Unix(0, 0).UTC()})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"running":1,"waiting":0,"kv_cache_usage":0,"prompt_tokens_per_s":0,"generation_tokens_per_s":0,"rates_valid":true,"scraped_at":"1970-01-01T00:00:00Z"}`
	if string(b) != want {
		t.Errorf("JSON = %s", b)
	}
}

// FuzzParse feeds arbitrary pages to both text parsers: Parse must not
// panic and must not return a value JSON cannot carry.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"vllm-v1.txt", "vllm-v0.txt", "vllm-dp.txt", "malformed.txt"} {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("vllm:num_requests_running{a=\"\\\"\"} 1e308\nvllm:num_requests_running 1e308\n"))
	f.Add([]byte("# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total 1\n# EOF\n"))
	formats := []expfmt.Format{expfmt.FmtText, expfmt.NewFormat(expfmt.TypeOpenMetrics)}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, format := range formats {
			s, err := Parse(bytes.NewReader(data), format, VLLM())
			if err != nil {
				continue
			}
			tr := NewTracker()
			tr.Observe("e", Sample{At: time.Unix(0, 0)})
			s.At = time.Unix(0, 1)
			l := tr.Observe("e", s)
			for _, v := range []float64{s.Running, s.Waiting, s.KVCacheUsage, s.PromptTokens, s.GenerationTokens, s.StartTime} {
				if math.IsNaN(v) {
					t.Fatalf("NaN in %+v", s)
				}
			}
			if _, err := json.Marshal(l); err != nil {
				t.Fatalf("marshal %+v: %v", l, err)
			}
		}
	})
}

// An engine that guards /metrics with its API key (llama.cpp) is scraped
// with the key; without WithBearer no Authorization header is sent.
func TestScraperSendsTheEngineKey(t *testing.T) {
	body := page(t, "vllm-v1.txt")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k1" {
			http.Error(w, `{"error":"Unauthorized"}`, http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	if _, err := NewScraper(srv.Client(), nil).Scrape(context.Background(), srv.URL); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("scrape without the key: %v, want a 401 error", err)
	}
	s, err := NewScraper(srv.Client(), nil, WithBearer("k1")).Scrape(context.Background(), srv.URL)
	if err != nil || s.Running != 7 {
		t.Fatalf("scrape with the key: %+v, %v", s, err)
	}
}

// The prefix cache's hit rate is over the interval, not since the engine
// started: a cache that warmed up long ago says nothing about now.
func TestTrackerPrefixHitRate(t *testing.T) {
	tr := NewTracker()
	at := func(s int) time.Time { return time.Unix(1000+int64(s), 0) }
	names := VLLM()
	page := "vllm:num_requests_running 1\nvllm:prefix_cache_hits_total %d\nvllm:prefix_cache_queries_total %d\n"
	sample := func(hits, queries int, s int) Sample {
		t.Helper()
		smp, err := Parse(strings.NewReader(fmt.Sprintf(page, hits, queries)), expfmt.FmtText, names)
		if err != nil {
			t.Fatal(err)
		}
		smp.At = at(s)
		return smp
	}
	if l := tr.Observe("e", sample(900, 1000, 0)); l.PrefixHitRate != 0 || l.PrefixQueriesPS != 0 {
		t.Fatalf("first sample: %+v, want no rate", l)
	}
	l := tr.Observe("e", sample(1000, 2000, 10))
	if l.PrefixHitRate != 0.1 || l.PrefixQueriesPS != 100 {
		t.Fatalf("100 hits of 1000 looked up in 10 s: rate %v at %v/s, want 0.1 at 100/s", l.PrefixHitRate, l.PrefixQueriesPS)
	}
	if l := tr.Observe("e", sample(1000, 2000, 20)); l.PrefixHitRate != 0 || l.PrefixQueriesPS != 0 {
		t.Fatalf("no lookups: %+v, want 0", l)
	}
	// Counters reset: a restart, no rate.
	if l := tr.Observe("e", sample(5, 10, 30)); l.PrefixHitRate != 0 || l.RatesValid {
		t.Fatalf("after a reset: %+v", l)
	}
}

// vLLM's LoRA gauge: every label set once current stays on the page, and
// the newest (the largest value, a time) is the state.
func TestLoRAInfo(t *testing.T) {
	page := `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters=""} 1.7000000001e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="code,sql",waiting_lora_adapters="chem"} 1.7000000005e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7000000002e+09
`
	s, err := Parse(strings.NewReader(page), expfmt.FmtText, Names{Running: "vllm:num_requests_running", LoRAInfo: "vllm:lora_requests_info"})
	if err != nil {
		t.Fatal(err)
	}
	if s.LoRA == nil || s.LoRA.Max != 2 || strings.Join(s.LoRA.Running, ",") != "code,sql" || strings.Join(s.LoRA.Waiting, ",") != "chem" {
		t.Errorf("LoRA %+v, want the newest series: max 2, running code,sql, waiting chem", s.LoRA)
	}
	s, _ = Parse(strings.NewReader("vllm:num_requests_running 1\n"), expfmt.FmtText, Names{Running: "vllm:num_requests_running", LoRAInfo: "vllm:lora_requests_info"})
	if s.LoRA != nil {
		t.Errorf("no gauge on the page: %+v, want nil", s.LoRA)
	}
}
