package fakeengine

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
)

// stream reads a streamed answer's data lines as they come.
type stream struct {
	mu     sync.Mutex
	events []string
	done   chan struct{}
}

func readStream(resp *http.Response) *stream {
	s := &stream{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				s.mu.Lock()
				s.events = append(s.events, line)
				s.mu.Unlock()
			}
		}
	}()
	return s
}

func (s *stream) count() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.events) }

// After POST /debug/hang nothing answers: /health, /v1/models and /metrics
// block without a byte, a stream in flight emits no further event, the
// token counters stop; the hook itself wants the engine's key. Every
// personality hangs alike.
func TestHangFreezesEverything(t *testing.T) {
	for _, p := range []Personality{PersonalityNone, PersonalityVLLM, PersonalitySGLang, PersonalityLlamaCpp} {
		t.Run(fmt.Sprintf("personality %q", p), func(t *testing.T) {
			// Each token delay waits for the test to pass it.
			steps := make(chan chan struct{})
			ts, srv := newTestServer(t, Config{Model: "m", Personality: p, TokenDelay: time.Hour, APIKey: "k", SGLangCheapHealth: true,
				Sleep: func(ctx context.Context, d time.Duration) bool {
					if d != time.Hour {
						return true
					}
					pass := make(chan struct{})
					select {
					case steps <- pass:
					case <-ctx.Done():
						return false
					}
					select {
					case <-pass:
						return true
					case <-ctx.Done():
						return false
					}
				}})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			do := func(ctx context.Context, method, path, key, body string) (*http.Response, error) {
				req, _ := http.NewRequestWithContext(ctx, method, ts.URL+path, strings.NewReader(body))
				if key != "" {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				return http.DefaultClient.Do(req)
			}
			resp, err := do(ctx, "POST", "/v1/chat/completions", "k", `{"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("stream: %v %v", resp, err)
			}
			st := readStream(resp)
			// The role and the first token, then the engine waits on the
			// second token's decode step.
			var pass chan struct{}
			select {
			case pass = <-steps:
			case <-time.After(10 * time.Second):
				t.Fatal("no decode step")
			}
			testwait.Until(t, 10*time.Second, "the first events", func() (bool, string) {
				return st.count() == 2, fmt.Sprintf("%d events", st.count())
			})
			gen, prompt := counterValue(t, srv.m.generation), counterValue(t, srv.m.prompt)

			if r, err := do(ctx, "POST", HangPath, "", ""); err != nil || r.StatusCode != 401 {
				t.Fatalf("%s without the key: %v %v, want 401", HangPath, r, err)
			} else {
				r.Body.Close()
			}
			if srv.Hung() {
				t.Fatal("hung without the key")
			}
			for range 2 { // idempotent
				r, err := do(ctx, "POST", HangPath, "k", "")
				if err != nil || r.StatusCode != 200 {
					t.Fatalf("%s: %v %v", HangPath, r, err)
				}
				r.Body.Close()
			}
			// The decode step ends, and the engine, hung, takes no further
			// step.
			close(pass)
			testwait.Until(t, 10*time.Second, "the stream blocked", func() (bool, string) {
				return srv.stuck.Load() == 1, fmt.Sprintf("%d blocked", srv.stuck.Load())
			})

			// Probes block without a byte: a client deadline passes.
			client := &http.Client{Timeout: 200 * time.Millisecond}
			if r, err := client.Get(ts.URL + "/health"); err == nil {
				r.Body.Close()
				t.Fatalf("/health answered %d while hung", r.StatusCode)
			} else if ne := (net.Error)(nil); !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("/health while hung: %v, want a timeout", err)
			}
			// So do the others, blocked where the engine's loop would be.
			type result struct {
				path string
				err  error
			}
			pctx, pcancel := context.WithCancel(ctx)
			results := make(chan result, 3)
			for _, path := range []string{"/v1/models", "/metrics", "/health"} {
				go func() {
					r, err := do(pctx, "GET", path, "k", "")
					if err == nil {
						r.Body.Close()
					}
					results <- result{path, err}
				}()
			}
			testwait.Until(t, 10*time.Second, "every probe blocked", func() (bool, string) {
				return srv.stuck.Load() == 4, fmt.Sprintf("%d blocked", srv.stuck.Load())
			})
			select {
			case r := <-results:
				t.Fatalf("%s answered while hung (err %v)", r.path, r.err)
			default:
			}
			testwait.StaysTrue(t, 200*time.Millisecond, "no further stream event", func() (bool, string) {
				return st.count() == 2, fmt.Sprintf("%d events", st.count())
			})
			if g, pr := counterValue(t, srv.m.generation), counterValue(t, srv.m.prompt); g != gen || pr != prompt {
				t.Errorf("counters moved while hung: generation %v→%v, prompt %v→%v", gen, g, prompt, pr)
			}
			pcancel()
			for range 3 {
				if r := <-results; r.err == nil {
					t.Errorf("%s answered after its client left", r.path)
				}
			}
			// Stopping the engine releases what the hang holds.
			srv.stop()
			testwait.Until(t, 10*time.Second, "the stream released", func() (bool, string) {
				return srv.stuck.Load() == 0, fmt.Sprintf("%d blocked", srv.stuck.Load())
			})
			<-st.done
			if n := st.count(); n != 2 {
				t.Errorf("the stream got %d events, want the 2 before the hang", n)
			}
		})
	}
}

// HangAfter hangs a running engine on its own: its /health stops
// answering, and Run still stops when asked.
func TestRunHangsAfter(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, Config{Model: "m", Listener: ln, HangAfter: time.Millisecond}) }()
	client := &http.Client{Timeout: 200 * time.Millisecond}
	testwait.Until(t, 10*time.Second, "/health stops answering", func() (bool, string) {
		r, err := client.Get("http://" + ln.Addr().String() + "/health")
		if err == nil {
			r.Body.Close()
			return false, r.Status
		}
		var ne net.Error
		return errors.As(err, &ne) && ne.Timeout(), err.Error()
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a hung engine did not stop")
	}
}
