// Package load reads an engine's load from its Prometheus /metrics page.
//
// Scraper fetches and parses one page into a Sample (gauges and counter
// totals). Tracker turns successive Samples of one engine into a Load with
// token rates: vLLM publishes token counts as counters, and a counter says
// nothing about now until it is differenced against an earlier reading.
package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/llmgw/llmgw/internal/clock"
)

// Names are the metric names a Sample is read from. Engine profiles are
// data, so another engine's names can be given here; VLLM returns vLLM's.
type Names struct {
	Running string
	Waiting string
	// KVCache is tried in order; the first name the page has wins.
	KVCache []string
	// Counters, summed over all label sets.
	PromptTokens     string
	GenerationTokens string
	// PrefixHits and PrefixQueries are the prefix cache's counters, in
	// tokens (vLLM counts the prompt tokens looked up and those found).
	PrefixHits    string
	PrefixQueries string
	// StartTime is the engine process's start time in Unix seconds; a
	// change means a restart even when the counters did not go down.
	StartTime string
	// LoRAInfo is vLLM's gauge of its LoRA slots (see LoRA); empty when
	// the engine has none.
	LoRAInfo string
}

// LoRA is an engine's adapters in use as its last vllm:lora_requests_info
// series says (vllm/v1/metrics/loggers.py): a gauge whose labels carry
// max_lora and the adapters of the requests running and waiting
// (comma-joined names) and whose value is when it was set, every label set
// once current staying on the page; the newest is the state. vLLM since
// the LoRA counts moved into the scheduler's stats lists in both labels
// every adapter with a request waiting or running; older releases split
// them. Either way Running names the adapters the engine is busy with.
type LoRA struct {
	Max     int
	Running []string
	Waiting []string
}

// VLLM returns vLLM's metric names. vllm:kv_cache_usage_perc replaced
// vllm:gpu_cache_usage_perc; a newer vLLM does not publish the old name at
// all, and reading only the old one reports an empty cache forever.
func VLLM() Names {
	return Names{
		Running:          "vllm:num_requests_running",
		Waiting:          "vllm:num_requests_waiting",
		KVCache:          []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
		PromptTokens:     "vllm:prompt_tokens_total",
		GenerationTokens: "vllm:generation_tokens_total",
		PrefixHits:       "vllm:prefix_cache_hits_total",
		PrefixQueries:    "vllm:prefix_cache_queries_total",
		StartTime:        "process_start_time_seconds",
	}
}

// Sample is one reading of an engine's page.
type Sample struct {
	// Running and Waiting are request counts, summed over label sets (a
	// data-parallel vLLM has one set per engine).
	Running float64
	Waiting float64
	// KVCacheUsage is the fraction (0-1) of the KV cache in use; with
	// several engines, the fullest, since that one queues first.
	KVCacheUsage float64
	// PromptTokens and GenerationTokens are counter totals since the engine
	// started.
	PromptTokens     float64
	GenerationTokens float64
	// PrefixHits and PrefixQueries are the prefix cache's counter totals.
	PrefixHits    float64
	PrefixQueries float64
	// StartTime is the engine's start time in Unix seconds, 0 if unknown.
	StartTime float64
	// Missing lists the names the page lacked (for KVCache, all of them).
	Missing []string
	// Unknown lists the readings the page did not give, by their Load
	// names (UnknownRunning, ...): a metric missing from the page, or one
	// the engine has no name for (llama.cpp no longer exports its KV
	// usage, PR #13660). Such a reading is 0 in the Sample, which must not
	// be taken for idle or empty.
	Unknown []string
	// At is when the page was read, by the Scraper's clock.
	At time.Time
	// LoRA is the engine's adapters in use; nil when its page has no
	// LoRA gauge (LoRA off, or no request since it started).
	LoRA *LoRA
}

// The readings a Sample's Unknown names, as a Load's JSON names them.
const (
	UnknownRunning          = "running"
	UnknownWaiting          = "waiting"
	UnknownKVCache          = "kv_cache_usage"
	UnknownPromptTokens     = "prompt_tokens"
	UnknownGenerationTokens = "generation_tokens"
)

// ErrNoMetrics is returned when a page parses but has none of the names: the
// URL points at something other than the engine, or the names are wrong.
var ErrNoMetrics = errors.New("load: page has none of the expected metrics")

// Parse reads a page in the given format (expfmt.ResponseFormat of the
// response; FmtText when unknown). It never panics on any input, and the
// Sample holds no NaN or Inf: such values are treated as absent, since they
// would break the JSON a Load is sent as.
func Parse(r io.Reader, format expfmt.Format, names Names) (Sample, error) {
	if format == expfmt.FmtUnknown {
		format = expfmt.FmtText
	}
	dec := expfmt.NewDecoder(r, format)
	fams := make(map[string]*dto.MetricFamily)
	for {
		mf := &dto.MetricFamily{}
		err := dec.Decode(mf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Sample{}, fmt.Errorf("load: parse metrics: %w", err)
		}
		fams[mf.GetName()] = mf
	}

	var s Sample
	found := false
	get := func(name string, combine func(acc, v float64) float64) (float64, bool) {
		v, ok := read(fams[name], combine)
		if ok {
			found = true
		} else if name != "" {
			s.Missing = append(s.Missing, name)
		}
		return v, ok
	}
	known := func(what string, ok bool) {
		if !ok {
			s.Unknown = append(s.Unknown, what)
		}
	}
	var ok bool
	s.Running, ok = get(names.Running, sum)
	known(UnknownRunning, ok)
	s.Waiting, ok = get(names.Waiting, sum)
	known(UnknownWaiting, ok)
	kvFound := false
	for _, n := range names.KVCache {
		if v, ok := read(fams[n], math.Max); ok {
			s.KVCacheUsage, kvFound, found = v, true, true
			break
		}
	}
	if !kvFound {
		s.Missing = append(s.Missing, names.KVCache...)
	}
	known(UnknownKVCache, kvFound)
	s.PromptTokens, ok = get(names.PromptTokens, sum)
	known(UnknownPromptTokens, ok)
	s.GenerationTokens, ok = get(names.GenerationTokens, sum)
	known(UnknownGenerationTokens, ok)
	// The prefix cache's counters are optional (not every engine has
	// one), so their absence is not reported as missing.
	if v, ok := read(fams[names.PrefixHits], sum); ok {
		s.PrefixHits = v
	}
	if v, ok := read(fams[names.PrefixQueries], sum); ok {
		s.PrefixQueries = v
	}
	// The start time alone does not make a page an engine's: every Python
	// process publishes it.
	if v, ok := read(fams[names.StartTime], math.Max); ok {
		s.StartTime = v
	}
	if !found {
		return Sample{}, ErrNoMetrics
	}
	s.LoRA = readLoRA(fams[names.LoRAInfo])
	return s, nil
}

// readLoRA reads the newest series of vLLM's LoRA gauge.
func readLoRA(mf *dto.MetricFamily) *LoRA {
	if mf == nil {
		return nil
	}
	var newest *dto.Metric
	for _, m := range mf.GetMetric() {
		v := m.GetGauge().GetValue()
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		if newest == nil || v > newest.GetGauge().GetValue() {
			newest = m
		}
	}
	if newest == nil {
		return nil
	}
	out := &LoRA{}
	split := func(v string) []string {
		var names []string
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, n)
			}
		}
		return names
	}
	for _, l := range newest.GetLabel() {
		switch l.GetName() {
		case "max_lora":
			out.Max, _ = strconv.Atoi(l.GetValue())
		case "running_lora_adapters":
			out.Running = split(l.GetValue())
		case "waiting_lora_adapters":
			out.Waiting = split(l.GetValue())
		}
	}
	return out
}

func sum(acc, v float64) float64 { return acc + v }

// read combines the finite values of a family's series; ok is false if it
// has none. Gauge, counter and untyped series are read alike: a page may
// declare no TYPE at all.
func read(mf *dto.MetricFamily, combine func(acc, v float64) float64) (float64, bool) {
	if mf == nil {
		return 0, false
	}
	var acc float64
	ok := false
	for _, m := range mf.GetMetric() {
		var v float64
		switch {
		case m.GetGauge() != nil:
			v = m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			v = m.GetCounter().GetValue()
		case m.GetUntyped() != nil:
			v = m.GetUntyped().GetValue()
		default:
			continue
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		if !ok {
			acc, ok = v, true
		} else {
			acc = combine(acc, v)
		}
	}
	if math.IsInf(acc, 0) { // finite values can still add up past MaxFloat64
		return 0, false
	}
	return acc, ok
}

// DefaultMaxBytes bounds a page. vLLM's, histograms included, is tens of
// kilobytes; a page far beyond that is not an engine's.
const DefaultMaxBytes = 8 << 20

// acceptText asks for the classic text format. Without it a Prometheus
// client library may answer in OpenMetrics (which Parse also reads) or
// protobuf.
const acceptText = "text/plain; version=0.0.4"

// Scraper fetches engines' /metrics pages. It is safe for concurrent use.
type Scraper struct {
	client   *http.Client
	clock    clock.Clock // stamps scrapes; rates are over its intervals, so a fake clock makes them exact
	names    Names
	maxBytes int64
	bearer   string
}

// Option configures a Scraper.
type Option func(*Scraper)

// WithNames reads other metric names than vLLM's.
func WithNames(n Names) Option { return func(s *Scraper) { s.names = n } }

// WithMaxBytes changes the largest page read (DefaultMaxBytes).
func WithMaxBytes(n int64) Option { return func(s *Scraper) { s.maxBytes = n } }

// WithBearer sends "Authorization: Bearer key" with every scrape, for an
// engine started with an API key that guards its /metrics too (llama.cpp
// does; vLLM and SGLang leave /metrics open and ignore the header). An
// empty key sends no header.
func WithBearer(key string) Option { return func(s *Scraper) { s.bearer = key } }

// NewScraper returns a Scraper. A nil client gets one with a 5 s timeout
// (http.DefaultClient has none, and a hung engine must not hang the
// prober); a nil clock is the real one.
func NewScraper(client *http.Client, clk clock.Clock, opts ...Option) *Scraper {
	if client == nil {
		client = &http.Client{Timeout: 5 * time.Second}
	}
	if clk == nil {
		clk = clock.Real()
	}
	s := &Scraper{client: client, clock: clk, names: VLLM(), maxBytes: DefaultMaxBytes}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Scrape fetches url (the full /metrics URL) and parses it. The Sample's At
// is set even when err is not nil, for Tracker.Failed.
func (s *Scraper) Scrape(ctx context.Context, url string) (Sample, error) {
	return s.ScrapeAs(ctx, url, s.bearer)
}

// ScrapeAs is Scrape presenting key as the bearer in place of the
// scraper's own (WithBearer): one scraper can then read many engines that
// each demand their own key, as llama.cpp does on /metrics. An empty key
// sends none.
func (s *Scraper) ScrapeAs(ctx context.Context, url, key string) (Sample, error) {
	return s.ScrapeWith(ctx, url, func(req *http.Request) {
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
	})
}

// ScrapeWith is Scrape with prepare called on the request before it is
// sent: a gateway signs a scrape it sends through another node's relay.
func (s *Scraper) ScrapeWith(ctx context.Context, url string, prepare func(*http.Request)) (Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Sample{At: s.clock.Now()}, fmt.Errorf("load: %w", err)
	}
	req.Header.Set("Accept", acceptText)
	if prepare != nil {
		prepare(req)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return Sample{At: s.clock.Now()}, fmt.Errorf("load: %w", err)
	}
	defer resp.Body.Close()
	at := s.clock.Now()
	if resp.StatusCode != http.StatusOK {
		return Sample{At: at}, fmt.Errorf("load: %s: %s", url, resp.Status)
	}
	body := &capReader{r: resp.Body, left: s.maxBytes}
	sample, err := Parse(body, expfmt.ResponseFormat(resp.Header), s.names)
	if body.over {
		return Sample{At: at}, fmt.Errorf("load: %s: page larger than %d bytes", url, s.maxBytes)
	}
	if err != nil {
		return Sample{At: at}, fmt.Errorf("%w (from %s)", err, url)
	}
	sample.At = at
	return sample, nil
}

// capReader reads at most left bytes and records whether there was more, so
// an oversized page is reported as such rather than as a parse error at
// the cut.
type capReader struct {
	r    io.Reader
	left int64
	over bool
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		var one [1]byte
		if n, _ := c.r.Read(one[:]); n > 0 {
			c.over = true
		}
		return 0, io.EOF
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}
