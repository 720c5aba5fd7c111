package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/profile"
)

// Busy is not dead: what the gateway sees of an engine decides whether it
// is ejected, how long it is waited on, and when its requests are let go.

// within bounds a test's requests to a gateway whose engine hangs: a
// gateway that does not let go fails the test instead of hanging it.
const within = 10 * time.Second

// hang is an engine that writes what start writes (nothing when nil),
// flushes, and then answers nothing more until the request is cancelled
// or the test ends.
func hang(t *testing.T, start func(w http.ResponseWriter)) *upstream {
	t.Helper()
	release := make(chan struct{})
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if start != nil {
			start(w)
			w.(http.Flusher).Flush()
		}
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	// Cleanups run last first: the handlers return before u.Close waits
	// on them.
	t.Cleanup(func() { close(release) })
	return u
}

// streamStart sends an event stream's headers and the given events.
func streamStart(events ...string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for _, e := range events {
			io.WriteString(w, e)
		}
	}
}

// bounded is the built-in profiles with the fake engine's gateway bounds
// set (zero leaves one as it is).
func bounded(firstByte, idle time.Duration) map[string]profile.Profile {
	ps := profile.Builtin()
	p := ps["fake"]
	if firstByte > 0 {
		p.Readiness.FirstByteTimeout = firstByte
	}
	if idle > 0 {
		p.Readiness.StreamIdleTimeout = idle
	}
	ps["fake"] = p
	return ps
}

// goPost posts body from a goroutine, the client giving up after within;
// a request that fails comes back as status 0 with the error as its body
// (t.Fatal belongs to the test's own goroutine).
func (h *harness) goPost(body string) <-chan answer {
	done := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(body))
		resp, err := h.srv.Client().Do(req)
		if err != nil {
			done <- answer{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			b = append(b, "; "+err.Error()...)
		}
		done <- answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
	}()
	return done
}

// stream posts body and returns the answer once its status and headers
// came (a stream's come at once), the client giving up after within.
func (h *harness) stream(body string) *http.Response {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	h.t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(body))
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// pass moves the gateway's clock on by d once the attempt in flight has
// armed its timer: a bound of the attempt passes when d reaches it.
func (h *harness) pass(d time.Duration) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := h.clock.BlockUntilContext(ctx, 1); err != nil {
		h.t.Fatalf("no attempt's timer armed: %v", err)
	}
	h.clock.Advance(d)
}

// withSpare is deployment "chat" with replica 0 at url on n1 and replica
// 1 at spare on n2, a suspect node: the spare is chosen only when the
// gateway retries, or when replica 0 is not routable.
func withSpare(url, spare string) *world {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Replicas: 2})
	w.node("n1", gossip.StateAlive)
	w.node("n2", gossip.StateSuspect)
	w.hold(cp{dep: "chat", replica: 0, node: "n1", url: url})
	w.hold(cp{dep: "chat", replica: 1, node: "n2", url: spare})
	return w
}

// 500, 502 and 504 before any byte reached the client count toward
// ejection like failed connections: EjectAfter of them in a row eject the
// replica. With no other replica, the engine's answer goes back.
func TestServerErrorsEject(t *testing.T) {
	for _, code := range []int{500, 502, 504} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			bad := newUpstream(t, statusHandler(code))
			h := newHarness(t, Config{}, oneDeployment(bad.URL).snapshot())
			rep := h.gw.routing.Load().routes["chat"][0].rep
			reason := fmt.Sprintf("status_%d", code)
			for i := range 3 {
				if rep.health.ejected(t0) {
					t.Fatalf("ejected after %d answers, want 3", i)
				}
				a := h.post("/v1/chat/completions", chatBody("chat", false))
				if a.status != code || !strings.Contains(a.body, fmt.Sprintf("engine says %d", code)) {
					t.Fatalf("request %d: %+v, want the engine's own answer", i, a)
				}
			}
			if !rep.health.ejected(t0) {
				t.Fatalf("not ejected after three %d answers in a row", code)
			}
			if n := value(t, h.gw.m.ejections.WithLabelValues("chat", "chat-0", reason)); n != 1 {
				t.Fatalf("ejections{reason=%s} = %v, want 1", reason, n)
			}
			if n := value(t, h.gw.m.upstreamErrors.WithLabelValues("chat", "chat-0", reason)); n != 3 {
				t.Fatalf("upstream errors{kind=%s} = %v, want 3", reason, n)
			}
		})
	}
}

// 502 and 504 are tried on another replica, as a failed connection is;
// 500 is relayed (it may be the request's own error) but still counts.
func TestServerErrorsRetriedOrRelayed(t *testing.T) {
	for _, code := range []int{500, 502, 504} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			bad, spare := newUpstream(t, statusHandler(code)), newUpstream(t, chatOK)
			h := newHarness(t, Config{}, withSpare(bad.URL, spare.URL).snapshot())
			a := h.post("/v1/chat/completions", chatBody("chat", false))
			if bad.hits.Load() != 1 {
				t.Fatalf("the failing replica got %d requests, want 1", bad.hits.Load())
			}
			retried := code != 500
			if retried && (a.status != 200 || a.header.Get("Llmgw-Replica") != "chat-1") {
				t.Fatalf("answer %d from %q, want 200 from the other replica", a.status, a.header.Get("Llmgw-Replica"))
			}
			if !retried && (a.status != 500 || spare.hits.Load() != 0) {
				t.Fatalf("answer %d, the other replica got %d: want the engine's 500, not retried", a.status, spare.hits.Load())
			}
			rep := h.gw.routing.Load().routes["chat"][0].rep
			rep.health.mu.Lock()
			failures := rep.health.failures
			rep.health.mu.Unlock()
			if failures != 1 {
				t.Fatalf("failures = %d, want 1", failures)
			}
		})
	}
}

// 429 and 503 say busy: however many, they never eject a replica, which
// keeps getting requests.
func TestBusyNeverEjects(t *testing.T) {
	for _, code := range []int{429, 503} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			busy := newUpstream(t, statusHandler(code))
			h := newHarness(t, Config{EjectAfter: 1}, oneDeployment(busy.URL).snapshot())
			for i := range 20 {
				if a := h.post("/v1/chat/completions", chatBody("chat", false)); a.status != code {
					t.Fatalf("request %d: %+v", i, a)
				}
			}
			if n := busy.hits.Load(); n != 20 {
				t.Fatalf("the busy replica got %d of 20 requests", n)
			}
			if h.gw.routing.Load().routes["chat"][0].rep.health.ejected(t0) || value(t, h.gw.m.ejections) != 0 {
				t.Fatal("a busy replica was ejected")
			}
		})
	}
}

// An engine that sends no byte within the first-byte bound: the client
// gets 504 naming the bound and the replica, the request is not tried
// elsewhere, and the replica counts a failure.
func TestFirstByteTimeout(t *testing.T) {
	cases := []struct {
		name   string
		start  func(w http.ResponseWriter)
		stream bool
	}{
		{"silent", nil, false},
		// A plain answer's headers alone commit nothing.
		{"headers only", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(200)
		}, false},
		// A stream's headers went to the client at once: it ends with an
		// error event instead.
		{"stream headers only", streamStart(), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hung, spare := hang(t, c.start), newUpstream(t, chatOK)
			h := newHarness(t, Config{EjectAfter: 1, Profiles: bounded(100*time.Millisecond, 0)}, withSpare(hung.URL, spare.URL).snapshot())
			var a answer
			if c.stream {
				// The bound passes once the stream's headers went out.
				resp := h.stream(chatBody("chat", true))
				h.pass(100 * time.Millisecond)
				b, _ := io.ReadAll(resp.Body)
				a = answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
			} else {
				done := h.goPost(chatBody("chat", false))
				testwait.Until(t, within, "the request reached the engine", func() (bool, string) {
					return hung.hits.Load() == 1, fmt.Sprint(hung.hits.Load())
				})
				h.pass(100 * time.Millisecond)
				a = <-done
			}
			var e errorBody
			if c.stream {
				if a.status != 200 || !strings.HasPrefix(a.body, "data: ") || !strings.HasSuffix(a.body, "\n\n") {
					t.Fatalf("answer %+v, want a stream that ends with an error event", a)
				}
				e = answer{body: strings.TrimSpace(strings.TrimPrefix(a.body, "data: "))}.apiError(t)
			} else {
				if a.status != 504 {
					t.Fatalf("answer %+v, want 504", a)
				}
				e = a.apiError(t)
			}
			if e.Error.Code != "first_byte_timeout" || !strings.Contains(e.Error.Message, "chat-0 on n1") || !strings.Contains(e.Error.Message, "100ms") {
				t.Fatalf("error %+v, want first_byte_timeout naming chat-0 on n1 and 100ms", e.Error)
			}
			if spare.hits.Load() != 0 {
				t.Fatal("a request that timed out waiting for its first byte was tried on another replica")
			}
			if n := value(t, h.gw.m.ejections.WithLabelValues("chat", "chat-0", "first_byte_timeout")); n != 1 {
				t.Fatalf("ejections{reason=first_byte_timeout} = %v, want 1", n)
			}
			if n := value(t, h.gw.m.upstreamErrors.WithLabelValues("chat", "chat-0", "first_byte_timeout")); n != 1 {
				t.Fatalf("upstream errors{kind=first_byte_timeout} = %v, want 1", n)
			}
		})
	}
}

// A first-byte timeout ejects the replica for EjectFor from when the bound
// passed, not from when the request was sent: the bound (minutes) is
// longer than the ejection (seconds), which would otherwise be over
// before it began.
func TestFirstByteTimeoutEjectsFromTheTimeout(t *testing.T) {
	hung := hang(t, nil)
	h := newHarness(t, Config{EjectAfter: 1, EjectFor: 10 * time.Second, Profiles: bounded(time.Minute, 0)}, oneDeployment(hung.URL).snapshot())
	done := h.goPost(chatBody("chat", false))
	testwait.Until(t, within, "the request reached the engine", func() (bool, string) {
		return hung.hits.Load() == 1, fmt.Sprint(hung.hits.Load())
	})
	h.pass(time.Minute)
	if a := <-done; a.status != 504 {
		t.Fatalf("answer %+v, want 504", a)
	}
	rep := h.gw.routing.Load().routes["chat"][0].rep
	if now := h.clock.Now(); !rep.health.ejected(now) || rep.health.ejected(now.Add(10*time.Second)) {
		t.Fatalf("at %v: ejected %v, ten seconds on %v: want ejected for ten seconds from the timeout",
			now, rep.health.ejected(now), rep.health.ejected(now.Add(10*time.Second)))
	}
}

// The stream-idle bound runs from the first byte on: before it, a stream
// whose headers came at once (vLLM sends them before the prefill) waits
// under the first-byte bound only, as a long prompt's prefill must.
func TestStreamIdleBoundStartsWithTheFirstByte(t *testing.T) {
	const idle = 50 * time.Millisecond
	for _, c := range []struct {
		name      string
		firstByte time.Duration
		cut       bool
	}{
		{"headers start no idle bound", within, false},
		// The negative control: a bound that does pass within those six
		// idle bounds cuts the request, and the same window sees it.
		{"negative control: a first-byte bound that passes", idle, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			release := make(chan struct{})
			var cancelled atomic.Bool
			slow := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				streamStart()(w)
				w.(http.Flusher).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
					cancelled.Store(true)
					return
				}
				io.WriteString(w, "data: {\"n\":1}\n\ndata: [DONE]\n\n")
			})
			t.Cleanup(func() {
				select {
				case <-release:
				default:
					close(release)
				}
			})
			h := newHarness(t, Config{Profiles: bounded(c.firstByte, idle)}, oneDeployment(slow.URL).snapshot())
			resp := h.stream(chatBody("chat", true))
			h.pass(6 * idle)
			// A window of real time: the fake clock runs a timer's function
			// in a goroutine of its own, so a bound that (wrongly) passed
			// cuts the request some time after Advance returns.
			check, what := testwait.StaysTrue, "waiting on the first event, six idle bounds on"
			if c.cut {
				check, what = testwait.BreaksWithin, "cut by a first-byte bound within six idle bounds"
			}
			check(t, 300*time.Millisecond, what, func() (bool, string) {
				return !cancelled.Load(), "the engine's request was cancelled"
			})
			close(release)
			b, _ := io.ReadAll(resp.Body)
			if c.cut {
				if e := (answer{body: strings.TrimSpace(strings.TrimPrefix(string(b), "data: "))}).apiError(t); e.Error.Code != "first_byte_timeout" {
					t.Fatalf("final event %+v, want first_byte_timeout", e.Error)
				}
				return
			}
			if resp.StatusCode != 200 || string(b) != "data: {\"n\":1}\n\ndata: [DONE]\n\n" {
				t.Fatalf("answer %d %q, want the whole stream", resp.StatusCode, b)
			}
		})
	}
}

// An answer that stops for longer than the stream-idle bound is cut: a
// stream with a final error event after the events that came, a plain
// answer by aborting the client's transfer.
func TestStreamIdleTimeout(t *testing.T) {
	t.Run("stream", func(t *testing.T) {
		hung := hang(t, streamStart("data: {\"n\":1}\n\n"))
		h := newHarness(t, Config{Profiles: bounded(0, 100*time.Millisecond)}, oneDeployment(hung.URL).snapshot())
		resp := h.stream(chatBody("chat", true))
		// The relay read the event before it passed it on: the idle bound
		// runs from that read.
		br := bufio.NewReader(resp.Body)
		first, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("first line %q: %v", first, err)
		}
		h.pass(100 * time.Millisecond)
		rest, _ := io.ReadAll(br)
		a := answer{status: resp.StatusCode, body: first + string(rest)}
		events := strings.SplitAfter(a.body, "\n\n")
		if a.status != 200 || len(events) != 3 || events[0] != "data: {\"n\":1}\n\n" || events[2] != "" {
			t.Fatalf("answer %d, events %q", a.status, events)
		}
		e := answer{body: strings.TrimSpace(strings.TrimPrefix(events[1], "data: "))}.apiError(t)
		if e.Error.Code != "stream_idle_timeout" || !strings.Contains(e.Error.Message, "chat-0 on n1") || !strings.Contains(e.Error.Message, "100ms") {
			t.Fatalf("final event %+v", e.Error)
		}
		if n := value(t, h.gw.m.upstreamErrors.WithLabelValues("chat", "chat-0", "stream_idle_timeout")); n != 1 {
			t.Fatalf("upstream errors{kind=stream_idle_timeout} = %v, want 1", n)
		}
	})
	t.Run("plain", func(t *testing.T) {
		hung := hang(t, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(200)
			io.WriteString(w, `{"id":"x","choi`)
		})
		h := newHarness(t, Config{StreamIdleTimeout: 100 * time.Millisecond}, oneDeployment(hung.URL).snapshot())
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody("chat", false)))
		resp, err := h.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		// The relay read these bytes before it passed them on: the idle
		// bound runs from that read.
		b := make([]byte, len(`{"id":"x","choi`))
		if _, err := io.ReadFull(resp.Body, b); err != nil {
			t.Fatalf("read %q: %v", b, err)
		}
		h.pass(100 * time.Millisecond)
		rest, err := io.ReadAll(resp.Body)
		if b = append(b, rest...); err == nil || ctx.Err() != nil {
			t.Fatalf("read %q, %v (client deadline: %v): want the transfer aborted by the gateway", b, err, ctx.Err())
		}
		if n := value(t, h.gw.m.upstreamErrors.WithLabelValues("chat", "chat-0", "stream_idle_timeout")); n != 1 {
			t.Fatalf("upstream errors{kind=stream_idle_timeout} = %v, want 1", n)
		}
	})
}

// The bounds are the engine kind's profile's unless Config sets them.
func TestBoundsFromProfileOrConfig(t *testing.T) {
	g := New(Config{Profiles: bounded(time.Minute, time.Second)})
	defer g.Shutdown(context.Background())
	if fb, idle := g.bounds("fake"); fb != time.Minute || idle != time.Second {
		t.Fatalf("profile bounds %v %v", fb, idle)
	}
	if fb, idle := g.bounds("no-such-engine"); fb != 0 || idle != 0 {
		t.Fatalf("an engine without a profile: %v %v, want none", fb, idle)
	}
	g2 := New(Config{Profiles: bounded(time.Minute, time.Second), FirstByteTimeout: 3 * time.Second, StreamIdleTimeout: 4 * time.Second})
	defer g2.Shutdown(context.Background())
	if fb, idle := g2.bounds("fake"); fb != 3*time.Second || idle != 4*time.Second {
		t.Fatalf("configured bounds %v %v", fb, idle)
	}
}

// republish is the view of withSpare where replica 0's copy on n1 is
// held as c says.
func republish(url, spare string, c cp) *world {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Replicas: 2})
	w.node("n1", gossip.StateAlive)
	w.node("n2", gossip.StateSuspect)
	c.dep, c.replica, c.node, c.url = "chat", 0, "n1", url
	w.hold(c)
	w.hold(cp{dep: "chat", replica: 1, node: "n2", url: spare})
	return w
}

// A replica whose engine leaves routing unready has its requests in flight
// cut: one that sent the client nothing goes to another replica, or gets
// 503 when there is none; a stream ends with an error event. A stopping
// or draining copy keeps its requests: they finish whole.
func TestLeavingRoutingCutsInFlight(t *testing.T) {
	unready := cp{lease: placement.LeaseStarting}
	cases := []struct {
		name    string
		copy    cp
		stream  bool
		spare   bool
		cut     bool
		status  int
		replica string
	}{
		{"unready, retried", unready, false, true, true, 200, "chat-1"},
		{"unready, no other replica", unready, false, false, true, 503, ""},
		{"unready, stream", unready, true, true, true, 200, "chat-0"},
		{"stopping", cp{lease: placement.LeaseLapsed, status: gossip.ShardStopping}, false, true, false, 200, "chat-0"},
		{"draining, unready", cp{lease: placement.LeaseStarting, drain: true}, false, true, false, 200, "chat-0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			release := make(chan struct{})
			held := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if c.stream {
					streamStart("data: {\"n\":1}\n\n")(w)
					w.(http.Flusher).Flush()
				}
				select {
				case <-r.Context().Done():
					return
				case <-release:
				}
				if c.stream {
					io.WriteString(w, "data: [DONE]\n\n")
					return
				}
				chatOK(w, r)
			})
			t.Cleanup(func() {
				select {
				case <-release:
				default:
					close(release)
				}
			})
			spare := newUpstream(t, chatOK)
			spareURL := spare.URL
			if !c.spare {
				spareURL = "" // no URL: never routable
			}
			h := newHarness(t, Config{}, withSpare(held.URL, spareURL).snapshot())
			done := h.goPost(chatBody("chat", c.stream))
			testwait.Until(t, within, "the request reached replica 0", func() (bool, string) {
				return held.hits.Load() == 1, fmt.Sprint(held.hits.Load())
			})
			h.gw.Update(republish(held.URL, spareURL, c.copy).snapshot())
			if !c.cut {
				// The request still waits on replica 0, which now ends
				// it: had it been cut, replica 1 would have answered.
				close(release)
			}
			a := <-done
			if a.status != c.status || a.header.Get("Llmgw-Replica") != c.replica {
				t.Fatalf("answer %d from %q (%s), want %d from %q", a.status, a.header.Get("Llmgw-Replica"), a.body, c.status, c.replica)
			}
			cuts := value(t, h.gw.m.upstreamErrors.WithLabelValues("chat", "chat-0", "left_routing"))
			if want := map[bool]float64{true: 1, false: 0}[c.cut]; cuts != want {
				t.Fatalf("upstream errors{kind=left_routing} = %v, want %v", cuts, want)
			}
			switch {
			case c.stream:
				events := strings.SplitAfter(a.body, "\n\n")
				if len(events) != 3 || events[0] != "data: {\"n\":1}\n\n" || events[2] != "" {
					t.Fatalf("events %q, want the first, then an error event", events)
				}
				if e := (answer{body: strings.TrimSpace(strings.TrimPrefix(events[1], "data: "))}).apiError(t); e.Error.Code != "replica_left_routing" {
					t.Fatalf("final event %+v", e.Error)
				}
			case c.status == 503:
				if e := a.apiError(t); e.Error.Code != "replica_left_routing" || !strings.Contains(e.Error.Message, "chat-0 on n1") {
					t.Fatalf("error %+v", e.Error)
				}
			case c.cut:
				if n := value(t, h.gw.m.retries.WithLabelValues("chat", "left_routing")); n != 1 {
					t.Fatalf("retries{reason=left_routing} = %v, want 1", n)
				}
			}
			if c.cut {
				// The table keeps the replica out already: leaving counts
				// nothing against it.
				if value(t, h.gw.m.ejections) != 0 {
					t.Fatal("a replica that left routing was ejected")
				}
			}
		})
	}
}
