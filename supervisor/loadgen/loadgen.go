// Package loadgen owns llmgw's load generator, in the spirit of `vllm bench
// serve`: it sends chat completions to an OpenAI-compatible endpoint (a
// node's gateway) from a workload, either a fixed number at once
// (Concurrency) or arriving as a Poisson process (Rate), for a number of
// requests or a duration, and reports throughput, time to first byte and
// latency percentiles, errors by kind and each replica's share of the
// requests (from the gateway's Llmgw-Replica header). Time and randomness
// are injected, so a test can check the arrivals and the arithmetic.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
)

// ReplicaHeader is the response header in which llmgw's gateway names the
// replica that answered.
const ReplicaHeader = "Llmgw-Replica"

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Workload gives request i its messages. It must be safe to call from
// several goroutines.
type Workload func(i int) []Message

// Config is one run.
type Config struct {
	// URL is the endpoint's base, e.g. http://127.0.0.1:8000; requests go
	// to URL/v1/chat/completions.
	URL    string
	Model  string
	APIKey string
	// Concurrency is how many requests are in flight at most. Without a
	// Rate it is a closed loop: each finished request starts the next.
	Concurrency int
	// Rate, when positive, starts requests as a Poisson process of this
	// many per second (exponential gaps drawn from Rand); Concurrency then
	// caps the requests in flight (zero: no cap).
	Rate float64
	// Requests stops after this many; Duration stops starting new ones
	// after this long. At least one must be set; with both, the first
	// reached ends the run. Requests in flight are waited for.
	Requests int
	Duration time.Duration
	Stream   bool
	// MaxTokens, when positive, is sent as max_tokens with ignore_eos, so
	// that every answer is that long (as `vllm bench serve --ignore-eos`).
	MaxTokens int
	Workload  Workload

	// Rand draws the arrival gaps; nil means a fixed seed of 0.
	Rand *rand.Rand
	// Now and Sleep are the clock; nil means the real one.
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) bool
	// Client sends the requests; nil means one with a connection pool
	// sized for Concurrency.
	Client *http.Client
	// Progress, when set, is called after every finished request with the
	// counts so far, from one goroutine.
	Progress func(Progress)
}

// Progress is the state of a run so far.
type Progress struct {
	Done, Failed int
	Elapsed      time.Duration
}

// result is one request's outcome.
type result struct {
	ttfb, latency              time.Duration
	promptTokens, outputTokens int
	replica                    string
	// kind is empty for a success, else the error kind (see Report.Errors).
	kind string
}

func (cfg *Config) check() error {
	switch {
	case strings.TrimSpace(cfg.URL) == "":
		return errors.New("loadgen: no URL to send to")
	case strings.TrimSpace(cfg.Model) == "":
		return errors.New("loadgen: a model is required")
	case cfg.Workload == nil:
		return errors.New("loadgen: a workload is required")
	case cfg.Concurrency < 0:
		return errors.New("loadgen: concurrency must not be negative")
	case cfg.Rate < 0:
		return errors.New("loadgen: rate must not be negative")
	case cfg.Rate == 0 && cfg.Concurrency == 0:
		return errors.New("loadgen: set a concurrency or a rate")
	case cfg.Requests < 0 || cfg.Duration < 0:
		return errors.New("loadgen: requests and duration must not be negative")
	case cfg.Requests == 0 && cfg.Duration == 0:
		return errors.New("loadgen: set a number of requests or a duration")
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.New(rand.NewPCG(0, 0))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Sleep == nil {
		cfg.Sleep = clock.SleepReal
	}
	if cfg.Client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = max(cfg.Concurrency, 64)
		cfg.Client = &http.Client{Transport: t}
	}
	cfg.URL = strings.TrimRight(cfg.URL, "/")
	return nil
}

// Run sends the load and reports on it. Cancelling ctx stops it early: the
// requests cut off count as "canceled".
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.check(); err != nil {
		return Report{}, err
	}
	results := make(chan result)
	var agg aggregate
	collected := make(chan struct{})
	start := cfg.Now()
	go func() {
		defer close(collected)
		for r := range results {
			agg.add(r)
			if cfg.Progress != nil {
				cfg.Progress(Progress{Done: agg.done, Failed: agg.failed, Elapsed: cfg.Now().Sub(start)})
			}
		}
	}()

	var slots chan struct{}
	if cfg.Concurrency > 0 {
		slots = make(chan struct{}, cfg.Concurrency)
	}
	var wg sync.WaitGroup
	over := func() bool {
		return ctx.Err() != nil || (cfg.Duration > 0 && cfg.Now().Sub(start) >= cfg.Duration)
	}
	// Arrivals keep to a schedule from the start, so time spent starting
	// requests does not slow the rate down.
	next := start
	for i := 0; cfg.Requests == 0 || i < cfg.Requests; i++ {
		if cfg.Rate > 0 {
			next = next.Add(time.Duration(cfg.Rand.ExpFloat64() / cfg.Rate * float64(time.Second)))
			if d := next.Sub(cfg.Now()); d > 0 && !cfg.Sleep(ctx, d) {
				break
			}
		}
		if slots != nil {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
			}
		}
		if over() {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := cfg.send(ctx, i)
			if slots != nil {
				<-slots
			}
			results <- r
		}()
	}
	wg.Wait()
	close(results)
	<-collected
	return agg.report(cfg.Now().Sub(start)), nil
}

// errKind names what went wrong with a request whose response never came.
func errKind(ctx context.Context) string {
	if ctx.Err() != nil {
		return "canceled"
	}
	return "connect"
}

// requestBody is the chat completion asked for.
func (cfg *Config) requestBody(i int) map[string]any {
	body := map[string]any{"model": cfg.Model, "messages": cfg.Workload(i), "stream": cfg.Stream}
	if cfg.Stream {
		// The usage chunk gives the token counts.
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	if cfg.MaxTokens > 0 {
		body["max_tokens"] = cfg.MaxTokens
		body["ignore_eos"] = true
	}
	return body
}

func httpKind(status int) string { return fmt.Sprintf("http %d", status) }
