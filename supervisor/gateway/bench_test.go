package gateway

// The gateway's cost, measured against the same load sent straight to one
// upstream, both paths in one run so that the noise of a shared machine
// falls on both alike:
//
//	go test -run '^$' -bench 'GatewayOpenLoop|GatewayStreams' -benchtime 10x -count 5 ./supervisor/gateway/
//
// BenchmarkGatewayOpenLoop offers 1,000 requests/s (1 KB and 24 KB
// prompts) and BenchmarkGatewayStreams keeps 100 streams going (1 KB
// prompts). Each b.N iteration gives each path 200 ms, in windows taken in
// turn. The "added" figures are the gateway's percentile less the direct
// one (a difference of percentiles, not a percentile of differences).
// -gwbench.engine=fakeengine puts the real fake engine behind both paths
// instead of the fixed answers, and -gwbench.tokendelay slows the upstream
// down to an engine's pace.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
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

var benchEngine = flag.String("gwbench.engine", "fixed",
	`the upstream of the gateway benchmarks: "fixed" (answers encoded once, the least an engine can cost, so what is measured beyond it is the gateway) or "fakeengine" (supervisor/fakeengine, which decodes each request and encodes each chunk)`)

var benchTokenDelay = flag.Duration("gwbench.tokendelay", 0,
	"a pause before each content token of the gateway benchmarks' upstream (a plain answer waits them all before it); 0, the default, is the fastest upstream")

const (
	benchRate    = 1000                   // open-loop arrivals per second, on each path
	benchWindow  = 200 * time.Millisecond // one path's time in one b.N iteration
	benchStreams = 100                    // concurrent streams of the closed loop
	streamTokens = 16                     // content chunks per stream (max_tokens)
	// streamEvents is what one stream carries: the role chunk, the
	// content chunks, the finish chunk and [DONE].
	streamEvents = streamTokens + 3
)

var benchSizes = []int{1 << 10, 24 << 10}

// fixedChat is the fastest engine there is: it reads the request and
// answers one fixed chat completion (after streamTokens token delays, when
// there is one), so what a benchmark measures beyond it is the gateway.
func fixedChat(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if !pause(r, time.Duration(streamTokens)*(*benchTokenDelay)) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"chat","choices":[{"index":0,"message":{"role":"assistant","content":"fake chat reply: hello"},"finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":1,"completion_tokens":4,"total_tokens":5}}`)
}

// fixedEvents are the events of fixedStream, encoded once: what the fake
// engine sends for a chat stream of streamTokens tokens.
var fixedEvents = func() [][]byte {
	ev := func(delta, finish string) []byte {
		return fmt.Appendf(nil, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"chat","choices":[{"delta":%s,"finish_reason":%s,"index":0,"logprobs":null}]}`+"\n\n", delta, finish)
	}
	out := [][]byte{ev(`{"content":"","role":"assistant"}`, "null")}
	for i := range streamTokens {
		out = append(out, ev(fmt.Sprintf(`{"content":" word%d"}`, i), "null"))
	}
	return append(out, ev("{}", `"stop"`), []byte("data: [DONE]\n\n"))
}()

// fixedStream streams fixedEvents, each flushed on its own as an engine
// sends each token.
func fixedStream(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for i, ev := range fixedEvents {
		if i >= 1 && i <= streamTokens && !pause(r, *benchTokenDelay) {
			return
		}
		if _, err := w.Write(ev); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
}

// pause waits d, or until the client went away (false).
func pause(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

func promptBody(size int, stream bool) string {
	words := strings.Repeat("lorem ", size/6+1)[:size]
	return fmt.Sprintf(`{"model":"chat","stream":%t,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":%q}],"max_tokens":%d,"temperature":0.2}`, stream, words, streamTokens)
}

// benchPath is one way to the upstream, with a client of its own.
type benchPath struct {
	url    string
	client *http.Client
	tr     *http.Transport
}

// newBenchPath is a client like the gateway's own transport. Its write
// buffer holds a whole 24 KB request: with a smaller one net/http writes
// the rest of the body through a 32 KB copy buffer made for each request,
// and the load generator's garbage would set the pace of the collections
// that the gateway's figures then pay for.
func newBenchPath(base string) *benchPath {
	tr := &http.Transport{MaxIdleConnsPerHost: 4 * benchStreams, DisableCompression: true,
		ReadBufferSize: 32 << 10, WriteBufferSize: 64 << 10}
	return &benchPath{url: base + "/v1/chat/completions", client: &http.Client{Transport: tr}, tr: tr}
}

// benchPair is one upstream reached directly and through a gateway.
type benchPair struct {
	direct, gateway *benchPath
	close           func()
}

// startFakeEngine runs the real fake engine on a free port, with
// -gwbench.tokendelay's delay (none by default).
func startFakeEngine(b *testing.B) (url string, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		ran <- fakeengine.Run(ctx, fakeengine.Config{Model: "chat", Listener: ln, TokenDelay: *benchTokenDelay})
	}()
	return "http://" + ln.Addr().String(), func() {
		cancel()
		if err := <-ran; err != nil {
			b.Error(err)
		}
	}
}

// newBenchPair starts the upstream (fixed, answering with h, unless
// -gwbench.engine says otherwise) and a gateway routing deployment "chat"
// to it, served as a node serves it (NewServer).
func newBenchPair(b *testing.B, h http.HandlerFunc) *benchPair {
	return newBenchPairWith(b, h, Config{})
}

// newBenchPairWith is newBenchPair with the gateway configured by cfg.
func newBenchPairWith(b *testing.B, h http.HandlerFunc, cfg Config) *benchPair {
	var upURL string
	var stopUp func()
	switch *benchEngine {
	case "fixed":
		mux := http.NewServeMux()
		mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
		})
		mux.HandleFunc("/v1/", h)
		up := httptest.NewServer(mux)
		upURL, stopUp = up.URL, up.Close
	case "fakeengine":
		upURL, stopUp = startFakeEngine(b)
	default:
		b.Fatalf("-gwbench.engine=%q: want fixed or fakeengine", *benchEngine)
	}
	w := newWorld()
	w.ttl = time.Hour
	w.deploy(placement.Deployment{Name: "chat"})
	w.node("n1", gossip.StateAlive)
	w.hold(cp{dep: "chat", node: "n1", url: upURL})
	gw := New(cfg)
	gw.Update(w.snapshotAt(time.Now()))
	gs := httptest.NewUnstartedServer(gw)
	gs.Config = newHTTPServer(gw, nil)
	gs.Start()
	p := &benchPair{direct: newBenchPath(upURL), gateway: newBenchPath(gs.URL)}
	p.close = func() {
		p.direct.tr.CloseIdleConnections()
		p.gateway.tr.CloseIdleConnections()
		gs.Close()
		_ = gw.Shutdown(context.Background())
		stopUp()
	}
	return p
}

// post sends one request and reads the whole answer.
func (pt *benchPath) post(body string) error {
	resp, err := pt.client.Post(pt.url, "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", pt.url, resp.Status)
	}
	return err
}

var sseDone = []byte("data: [DONE]\n\n")

// stream sends one streamed request and reads it to the end: ttfb is when
// the first byte of the first event arrived, total when the stream ended.
func (pt *benchPath) stream(body string, buf *bytes.Buffer) (ttfb, total time.Duration, err error) {
	start := time.Now()
	resp, err := pt.client.Post(pt.url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("%s: %s", pt.url, resp.Status)
	}
	var first [1]byte
	if _, err := io.ReadFull(resp.Body, first[:]); err != nil {
		return 0, 0, err
	}
	ttfb = time.Since(start)
	buf.Reset()
	buf.Write(first[:])
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return 0, 0, err
	}
	total = time.Since(start)
	if got := bytes.Count(buf.Bytes(), []byte("data: ")); got != streamEvents || !bytes.HasSuffix(buf.Bytes(), sseDone) {
		return 0, 0, fmt.Errorf("%s: a stream of %d events, want %d ending with [DONE]: %q", pt.url, got, streamEvents, buf.Bytes())
	}
	return ttfb, total, nil
}

// pathStats gathers one path's windows.
type pathStats struct {
	lat, ttfb, lag []time.Duration
	done           int
	span           time.Duration // the measured time of the windows
}

func (s *pathStats) rate() float64 { return float64(s.done) / s.span.Seconds() }

// openLoop sends benchRate requests a second to pt for d. Each request
// leaves at its due time, on a schedule fixed in advance, whether or not
// the earlier ones were answered (a sender that falls behind sends the
// late ones at once, and never skips one), so a slow answer cannot hold
// back the requests after it and hide the time they would have waited
// (coordinated omission). Latency counts from when a request was sent;
// how late the sender was (the runtime's timers wake it about once a
// millisecond) is kept apart, in lag. The window ends when its last answer
// arrives.
func openLoop(pt *benchPath, body string, d time.Duration, s *pathStats) error {
	n := int(d * benchRate / time.Second)
	interval := time.Second / benchRate
	lat := make([]time.Duration, n)
	lag := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if w := time.Until(due); w > 0 {
			time.Sleep(w)
		}
		sent := time.Now()
		lag[i] = sent.Sub(due)
		wg.Go(func() {
			errs[i] = pt.post(body)
			lat[i] = time.Since(sent)
		})
	}
	wg.Wait()
	s.span += time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	s.lat = append(s.lat, lat...)
	s.lag = append(s.lag, lag...)
	s.done += n
	return nil
}

// closedLoop keeps benchStreams streams going to pt for d: each of as many
// clients starts its next stream as soon as its last one ended. All of
// them start at once, so the first quarter of the window is a ramp and not
// measured: the latencies are those of the streams begun after it, the
// throughput the streams that ended between it and d. The clients finish
// the streams they began before d.
func closedLoop(pt *benchPath, body string, d time.Duration, s *pathStats) error {
	type result struct {
		ttfb, total []time.Duration
		done        int
		err         error
	}
	out := make([]result, benchStreams)
	var wg sync.WaitGroup
	start := time.Now()
	from, deadline := start.Add(d/4), start.Add(d)
	for c := range out {
		wg.Go(func() {
			var buf bytes.Buffer
			for began := time.Now(); began.Before(deadline); began = time.Now() {
				ttfb, total, err := pt.stream(body, &buf)
				if err != nil {
					out[c].err = err
					return
				}
				if !began.Before(from) {
					out[c].ttfb = append(out[c].ttfb, ttfb)
					out[c].total = append(out[c].total, total)
				}
				if end := began.Add(total); !end.Before(from) && !end.After(deadline) {
					out[c].done++
				}
			}
		})
	}
	wg.Wait()
	s.span += deadline.Sub(from)
	for _, r := range out {
		if r.err != nil {
			return r.err
		}
		s.ttfb = append(s.ttfb, r.ttfb...)
		s.lat = append(s.lat, r.total...)
		s.done += r.done
	}
	return nil
}

// interleave runs, per b.N iteration, windows windows of d on each path in
// turn, ABBA-ordered (one window each: AB), the direct path first in even
// iterations and the gateway's first in odd ones, so that drift and the
// noise of a shared machine fall on both alike. A short warm-up window on
// each (connections, buffers) is not counted.
func interleave(b *testing.B, p *benchPair, windows int, d time.Duration, window func(*benchPath, time.Duration, *pathStats) error) (direct, gateway *pathStats) {
	var warm pathStats
	for _, pt := range []*benchPath{p.direct, p.gateway} {
		if err := window(pt, 50*time.Millisecond, &warm); err != nil {
			b.Fatal(err)
		}
	}
	direct, gateway = &pathStats{}, &pathStats{}
	type leg struct {
		pt *benchPath
		s  *pathStats
	}
	b.ResetTimer()
	for i := range b.N {
		ab := [2]leg{{p.direct, direct}, {p.gateway, gateway}}
		if i%2 == 1 {
			ab[0], ab[1] = ab[1], ab[0]
		}
		for k := range 2 * windows {
			l := ab[0]
			if k%4 == 1 || k%4 == 2 {
				l = ab[1]
			}
			if err := window(l.pt, d, l.s); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	return direct, gateway
}

func pct(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return quantile(s, q)
}

// reportLatency reports both paths' p50 and p99 of one latency, and what
// the gateway adds to each, in µs.
func reportLatency(b *testing.B, name string, direct, gateway []time.Duration) {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	for _, q := range []struct {
		name string
		q    float64
	}{{"p50", .5}, {"p99", .99}} {
		d, g := pct(direct, q.q), pct(gateway, q.q)
		b.ReportMetric(us(d), fmt.Sprintf("direct-%s%s-µs", name, q.name))
		b.ReportMetric(us(g), fmt.Sprintf("gateway-%s%s-µs", name, q.name))
		b.ReportMetric(us(g-d), fmt.Sprintf("added-%s%s-µs", name, q.name))
	}
}

// reportRate reports both paths' completed requests (or streams) per
// second and the gateway's as a fraction of the direct one.
func reportRate(b *testing.B, unit string, direct, gateway *pathStats) {
	b.ReportMetric(direct.rate(), "direct-"+unit)
	b.ReportMetric(gateway.rate(), "gateway-"+unit)
	b.ReportMetric(gateway.rate()/direct.rate(), "throughput-ratio")
}

// BenchmarkGatewayOpenLoop offers the same 1,000 requests/s, open loop, to
// one fast upstream straight and through the gateway, in alternate
// windows: the latency the gateway adds per request (body read and scan,
// routing, a second hop on loopback) at that rate, and whether it keeps up
// (completed requests/s, and the ratio of the gateway's to the direct).
func BenchmarkGatewayOpenLoop(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("prompt=%dKB", size>>10), func(b *testing.B) {
			p := newBenchPair(b, fixedChat)
			defer p.close()
			body := promptBody(size, false)
			direct, gateway := interleave(b, p, 2, benchWindow/2, func(pt *benchPath, d time.Duration, s *pathStats) error {
				return openLoop(pt, body, d, s)
			})
			reportLatency(b, "", direct.lat, gateway.lat)
			b.ReportMetric(float64(pct(slices.Concat(direct.lag, gateway.lag), .99))/float64(time.Microsecond), "sender-lag-p99-µs")
			reportRate(b, "req/s", direct, gateway)
		})
	}
}

// BenchmarkGatewayStreams keeps 100 streams (stream: true, streamTokens
// content chunks then [DONE], each flushed on its own) going, closed
// loop, straight to one fast upstream and through the gateway, in
// alternate windows: the time to the first byte and to the stream's end
// on each path, what the gateway adds, and streams/s. This load saturates
// the machine, so the latencies are mostly queueing (100 streams over
// streams/s, by Little's law) and the ratio is the gateway's cost in
// CPU.
func BenchmarkGatewayStreams(b *testing.B) {
	// The prompt's size costs a stream what it costs a plain request,
	// which BenchmarkGatewayOpenLoop measures; the stream is the events.
	for _, size := range []int{1 << 10} {
		b.Run(fmt.Sprintf("prompt=%dKB", size>>10), func(b *testing.B) {
			p := newBenchPair(b, fixedStream)
			defer p.close()
			body := promptBody(size, true)
			direct, gateway := interleave(b, p, 1, benchWindow, func(pt *benchPath, d time.Duration, s *pathStats) error {
				return closedLoop(pt, body, d, s)
			})
			reportLatency(b, "ttfb-", direct.ttfb, gateway.ttfb)
			reportLatency(b, "stream-", direct.lat, gateway.lat)
			reportRate(b, "streams/s", direct, gateway)
		})
	}
}
