package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// fixedChat is the fastest engine there is: it reads the request and
// answers one fixed chat completion, so what a benchmark measures beyond it
// is the gateway.
func fixedChat(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"chat","choices":[{"index":0,"message":{"role":"assistant","content":"fake chat reply: hello"},"finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":1,"completion_tokens":4,"total_tokens":5}}`)
}

func promptBody(size int) string {
	words := strings.Repeat("lorem ", size/6+1)[:size]
	return fmt.Sprintf(`{"model":"chat","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":%q}],"max_tokens":16,"temperature":0.2}`, words)
}

// benchPair is one upstream reached directly and through a gateway.
type benchPair struct {
	direct, viaGateway string
	client             *http.Client
	close              func()
}

func newBenchPair(b *testing.B) *benchPair {
	up := httptest.NewServer(http.HandlerFunc(fixedChat))
	w := newWorld()
	w.ttl = time.Hour
	w.deploy(placement.Deployment{Name: "chat"})
	w.node("n1", gossip.StateAlive)
	w.hold(cp{dep: "chat", node: "n1", url: up.URL})
	gw := New(Config{})
	gw.Update(w.snapshotAt(time.Now()))
	gs := httptest.NewServer(gw)
	tr := &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
	return &benchPair{direct: up.URL, viaGateway: gs.URL, client: &http.Client{Transport: tr}, close: func() {
		tr.CloseIdleConnections()
		gs.Close()
		_ = gw.Shutdown(context.Background())
		up.Close()
	}}
}

func (p *benchPair) do(b *testing.B, base, body string) time.Duration {
	start := time.Now()
	resp, err := p.client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("%s: %s", base, resp.Status)
	}
	return time.Since(start)
}

func pct(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return quantile(s, q)
}

// BenchmarkGatewayOverhead sends the same requests straight to one fast
// upstream and through the gateway, interleaved so that noise falls on
// both alike, one at a time: the difference is the latency the gateway
// adds per request (body read and scan, routing, a second hop on
// loopback).
func BenchmarkGatewayOverhead(b *testing.B) {
	for _, size := range []int{1 << 10, 24 << 10} {
		b.Run(fmt.Sprintf("prompt=%dKB", size>>10), func(b *testing.B) {
			p := newBenchPair(b)
			defer p.close()
			body := promptBody(size)
			p.do(b, p.direct, body)
			p.do(b, p.viaGateway, body)
			direct := make([]time.Duration, 0, b.N)
			via := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				direct = append(direct, p.do(b, p.direct, body))
				via = append(via, p.do(b, p.viaGateway, body))
			}
			b.StopTimer()
			us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
			b.ReportMetric(us(pct(direct, .5)), "direct-p50-µs")
			b.ReportMetric(us(pct(via, .5)), "gateway-p50-µs")
			b.ReportMetric(us(pct(via, .5)-pct(direct, .5)), "added-p50-µs")
			b.ReportMetric(us(pct(via, .99)-pct(direct, .99)), "added-p99-µs")
		})
	}
}

// BenchmarkGatewayThroughput runs the same load, 16 clients at once,
// straight to the upstream and then through the gateway, and reports the
// gateway's requests per second as a fraction of the direct ones.
func BenchmarkGatewayThroughput(b *testing.B) {
	const clients = 16
	for _, size := range []int{1 << 10, 24 << 10} {
		b.Run(fmt.Sprintf("prompt=%dKB", size>>10), func(b *testing.B) {
			p := newBenchPair(b)
			defer p.close()
			body := promptBody(size)
			run := func(base string) time.Duration {
				var wg sync.WaitGroup
				next := make(chan struct{}, b.N)
				for range b.N {
					next <- struct{}{}
				}
				close(next)
				start := time.Now()
				for range clients {
					wg.Go(func() {
						for range next {
							p.do(b, base, body)
						}
					})
				}
				wg.Wait()
				return time.Since(start)
			}
			run(p.direct)
			run(p.viaGateway)
			b.ResetTimer()
			d := run(p.direct)
			g := run(p.viaGateway)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/d.Seconds(), "direct-req/s")
			b.ReportMetric(float64(b.N)/g.Seconds(), "gateway-req/s")
			b.ReportMetric(d.Seconds()/g.Seconds(), "throughput-ratio")
		})
	}
}
