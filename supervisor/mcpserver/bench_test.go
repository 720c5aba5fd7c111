package mcpserver

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The load benchmarks fire bursts of concurrent requests at one real node
// on loopback. One benchmark op is one whole burst; any failed request
// fails the benchmark. They report requests per second and the 99th
// percentile latency of a single request within a burst.
//
//	go test ./supervisor/mcpserver -run '^$' -bench Load -benchtime 20x

const (
	statusBurst = 1000
	mcpBurst    = 200
)

// burst runs fn concurrently n times and returns each call's latency. The
// first error fails the benchmark.
func burst(b *testing.B, n int, fn func(i int) error) []time.Duration {
	lat := make([]time.Duration, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			if err := fn(i); err != nil {
				errs <- err
			}
			lat[i] = time.Since(t0)
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	var failed []string
	for err := range errs {
		failed = append(failed, err.Error())
	}
	if len(failed) > 0 {
		b.Fatalf("%d of %d requests failed; first: %s", len(failed), n, failed[0])
	}
	return lat
}

func report(b *testing.B, lat []time.Duration, elapsed time.Duration) {
	slices.Sort(lat)
	p := func(q float64) time.Duration { return lat[min(len(lat)-1, int(q*float64(len(lat))))] }
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(p(0.50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(p(0.99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
}

func BenchmarkLoadStatusJSON(b *testing.B) {
	tn := startNode(b, "alpha")
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = statusBurst
	tr.MaxIdleConnsPerHost = statusBurst
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	url := tn.url("/status.json")
	get := func(int) error {
		resp, err := hc.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"name": "alpha"`) {
			return fmt.Errorf("GET /status.json: %s: %.200s", resp.Status, body)
		}
		return nil
	}
	var all []time.Duration
	var elapsed time.Duration
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		all = append(all, burst(b, statusBurst, get)...)
		elapsed += time.Since(t0)
	}
	report(b, all, elapsed)
}

func BenchmarkLoadMCPMeminfo(b *testing.B) {
	tn := startNode(b, "alpha")
	// One client session per concurrent caller, as 200 assistants would
	// have. Connecting (server/discover) is outside the timing.
	sessions := make([]*mcp.ClientSession, mcpBurst)
	hc := tokenClient(testToken)
	hc.Transport.(*headerTransport).base.(*http.Transport).MaxIdleConnsPerHost = mcpBurst
	cl := mcp.NewClient(&mcp.Implementation{Name: "bench"}, nil)
	for i := range sessions {
		cs, err := cl.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: tn.url(Path), HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cs.Close() })
		sessions[i] = cs
	}
	call := func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := sessions[i].CallTool(ctx, &mcp.CallToolParams{Name: "meminfo", Arguments: map[string]any{}})
		if err != nil {
			return err
		}
		if res.IsError || !strings.HasPrefix(text(res), "[host-alpha ") {
			return fmt.Errorf("meminfo: isError=%v %.200q", res.IsError, text(res))
		}
		return nil
	}
	var all []time.Duration
	var elapsed time.Duration
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		all = append(all, burst(b, mcpBurst, call)...)
		elapsed += time.Since(t0)
	}
	report(b, all, elapsed)
}
