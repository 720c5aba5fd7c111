package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
)

// refusedURL is an address nothing listens on: connecting is refused.
func refusedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// A request goes to a routable replica, and the answer comes back whole,
// with the replica named.
func TestProxiesChat(t *testing.T) {
	u := newUpstream(t, chatOK)
	h := newHarness(t, Config{}, oneDeployment(u.URL).snapshot())
	a := h.post("/v1/chat/completions", chatBody("chat", false))
	if a.status != 200 || !strings.Contains(a.body, `"model":"chat"`) || a.header.Get("Llmgw-Replica") != "chat-0" || a.header.Get("Llmgw-Node") != "n1" {
		t.Fatalf("answer = %+v", a)
	}
	if string(u.lastBody()) != chatBody("chat", false) {
		t.Fatalf("upstream got %q, want the body unchanged", u.lastBody())
	}
}

// A connection refused is retried on another replica; after several in a
// row the replica is ejected, and skipped.
func TestRetriesRefusedConnectionOnAnotherReplica(t *testing.T) {
	u := newUpstream(t, chatOK)
	dead := refusedURL(t)
	h := newHarness(t, Config{EjectAfter: 2}, oneDeployment(dead, u.URL).snapshot())
	for i := range 6 {
		if a := h.post("/v1/chat/completions", chatBody("chat", false)); a.status != 200 || a.header.Get("Llmgw-Replica") != "chat-1" {
			t.Fatalf("request %d: %d %s (replica %q)", i, a.status, a.body, a.header.Get("Llmgw-Replica"))
		}
	}
	if n := u.hits.Load(); n != 6 {
		t.Fatalf("live replica served %d, want 6", n)
	}
	connects := value(t, h.gw.m.upstreamErrors.WithLabelValues("chat", "chat-0", "connect"))
	if connects != 2 {
		t.Fatalf("connect errors %v, want 2: once ejected, chat-0 is skipped", connects)
	}
	if n := value(t, h.gw.m.ejections.WithLabelValues("chat", "chat-0", "connect")); n != 1 {
		t.Fatalf("ejections %v, want 1", n)
	}
	if n := value(t, h.gw.m.retries.WithLabelValues("chat", "connect")); n != 2 {
		t.Fatalf("retries %v, want 2", n)
	}
}

// When every replica refuses, the client gets a 502 in OpenAI's shape after
// at most three attempts.
func TestEveryReplicaRefusing(t *testing.T) {
	urls := []string{refusedURL(t), refusedURL(t), refusedURL(t), refusedURL(t)}
	h := newHarness(t, Config{}, oneDeployment(urls...).snapshot())
	a := h.post("/v1/chat/completions", chatBody("chat", false))
	if a.status != 502 || a.apiError(t).Error.Code != "upstream_unavailable" {
		t.Fatalf("answer = %+v", a)
	}
	var attempts float64
	for i := range 4 {
		attempts += value(t, h.gw.m.upstreamErrors.WithLabelValues("chat", fmt.Sprintf("chat-%d", i), "connect"))
	}
	if attempts != 3 {
		t.Fatalf("%v attempts, want 3 (one try, two retries)", attempts)
	}
}

// When every replica is ejected, they are tried anyway rather than the
// request refused.
func TestAllEjectedTriedAnyway(t *testing.T) {
	u := newUpstream(t, chatOK)
	h := newHarness(t, Config{}, oneDeployment(u.URL).snapshot())
	rt := h.gw.routing.Load()
	rt.routes["chat"][0].rep.health.eject(t0, time.Hour)
	if a := h.post("/v1/chat/completions", chatBody("chat", false)); a.status != 200 {
		t.Fatalf("answer = %+v", a)
	}
	if rt.routes["chat"][0].rep.health.ejected(t0) {
		t.Fatal("a replica that answered is still ejected")
	}
}

// hijackAfter writes status and headers (and events), then drops the
// connection the way a dying engine does.
func hijackAfter(events ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for _, e := range events {
			io.WriteString(w, e)
		}
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}
}

// Once the engine answered, nothing is retried: an engine that sent its
// headers and died gets no second replica, and the client an error event.
func TestNoRetryAfterHeaders(t *testing.T) {
	dying := newUpstream(t, hijackAfter())
	other := newUpstream(t, chatOK)
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Replicas: 2})
	w.node("n1", gossip.StateAlive)
	w.node("n2", gossip.StateSuspect) // chosen only if the gateway retried
	w.hold(cp{dep: "chat", replica: 0, node: "n1", url: dying.URL})
	w.hold(cp{dep: "chat", replica: 1, node: "n2", url: other.URL})
	h := newHarness(t, Config{}, w.snapshot())
	a := h.post("/v1/chat/completions", chatBody("chat", true))
	if a.status != 200 || other.hits.Load() != 0 || dying.hits.Load() != 1 {
		t.Fatalf("status %d, dying %d hits, other %d hits: want one attempt only", a.status, dying.hits.Load(), other.hits.Load())
	}
	if !strings.HasPrefix(a.body, `data: {"error":`) {
		t.Fatalf("body %q, want an error event", a.body)
	}
}

// A stream whose engine dies mid-way ends with the events that completed,
// then a final error event: never half an event, never a silent end.
func TestMidStreamDeathEndsWithErrorEvent(t *testing.T) {
	u := newUpstream(t, hijackAfter("data: {\"n\":1}\n\n", "data: {\"n\":2}\n\n", "data: {\"n\":3, \"cut"))
	h := newHarness(t, Config{}, oneDeployment(u.URL).snapshot())
	a := h.post("/v1/chat/completions", chatBody("chat", true))
	events := strings.SplitAfter(a.body, "\n\n")
	if len(events) != 4 || events[3] != "" || events[0] != "data: {\"n\":1}\n\n" || events[1] != "data: {\"n\":2}\n\n" {
		t.Fatalf("events %q", events)
	}
	var e errorBody
	if err := json.Unmarshal([]byte(strings.TrimSpace(strings.TrimPrefix(events[2], "data: "))), &e); err != nil ||
		e.Error.Code != "upstream_stream_error" || !strings.Contains(e.Error.Message, "chat-0 on n1") {
		t.Fatalf("final event %q: %v", events[2], err)
	}
	if n := value(t, h.gw.m.upstreamErrors.WithLabelValues("chat", "chat-0", "stream")); n != 1 {
		t.Fatalf("stream errors %v", n)
	}
}

// A non-streamed answer cut short is not passed off as whole: the client's
// transfer fails.
func TestTruncatedBodyAbortsTheClient(t *testing.T) {
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		io.WriteString(w, `{"id":"x","choi`)
		w.(http.Flusher).Flush()
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	})
	h := newHarness(t, Config{}, oneDeployment(u.URL).snapshot())
	resp, err := h.srv.Client().Post(h.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("chat", false)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("reading a truncated answer succeeded")
	}
}

// Events pass through as they come: the client has the first before the
// engine writes the second.
func TestStreamIsNotBuffered(t *testing.T) {
	release := make(chan struct{})
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: {\"n\":2,\"usage\":{\"total_tokens\":3}}\n\ndata: [DONE]\n\n")
	})
	h := newHarness(t, Config{}, oneDeployment(u.URL).snapshot())
	body := `{"model":"chat","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`
	resp, err := h.srv.Client().Post(h.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || first != "data: {\"n\":1}\n" {
		t.Fatalf("first line %q, %v", first, err)
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if string(rest) != "\ndata: {\"n\":2,\"usage\":{\"total_tokens\":3}}\n\ndata: [DONE]\n\n" {
		t.Fatalf("rest %q", rest)
	}
	if !bytes.Contains(u.lastBody(), []byte(`"stream_options":{"include_usage":true}`)) {
		t.Fatalf("stream_options did not reach the engine: %s", u.lastBody())
	}
}

// A client that goes away cancels the upstream request.
func TestClientCancelReachesUpstream(t *testing.T) {
	arrived, cancelled := make(chan struct{}), make(chan struct{})
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		close(arrived)
		<-r.Context().Done()
		close(cancelled)
	})
	h := newHarness(t, Config{}, oneDeployment(u.URL).snapshot())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody("chat", true)))
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-arrived
	cancel()
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream request was not cancelled")
	}
	testwait.Until(t, 5*time.Second, "the request counted as the client's going away", func() (bool, string) {
		n := value(t, h.gw.m.requests.WithLabelValues("chat", "499"))
		return n == 1, fmt.Sprint(n)
	})
}

// 4xx answers are the request's fault: they pass through unchanged and
// never count against the replica.
func TestClientErrorsPassThrough(t *testing.T) {
	u := newUpstream(t, statusHandler(400))
	h := newHarness(t, Config{EjectAfter: 1}, oneDeployment(u.URL).snapshot())
	for range 5 {
		a := h.post("/v1/chat/completions", chatBody("chat", false))
		if a.status != 400 || !strings.Contains(a.body, "engine says 400") {
			t.Fatalf("answer = %+v", a)
		}
	}
	if u.hits.Load() != 5 || h.gw.routing.Load().routes["chat"][0].rep.health.ejected(t0) {
		t.Fatalf("hits %d; the replica must serve them all and stay in", u.hits.Load())
	}
	if n := count(h.gw.m.ejections); n != 0 {
		t.Fatalf("%d ejection series", n)
	}
}

// 401/403 from an engine is the gateway's key disagreeing with the
// engine's: the replica is ejected and another tried; the client never
// sees the engine's 401.
func TestEngineAuthFailureEjectsAndRetries(t *testing.T) {
	for _, code := range []int{401, 403} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			bad := newUpstream(t, statusHandler(code))
			good := newUpstream(t, chatOK)
			h := newHarness(t, Config{}, oneDeployment(bad.URL, good.URL).snapshot())
			for i := range 4 {
				if a := h.post("/v1/chat/completions", chatBody("chat", false)); a.status != 200 {
					t.Fatalf("request %d: %+v", i, a)
				}
			}
			if bad.hits.Load() > 1 {
				t.Fatalf("the refusing replica got %d requests, want at most 1: it is ejected", bad.hits.Load())
			}

			only := newUpstream(t, statusHandler(code))
			h = newHarness(t, Config{}, oneDeployment(only.URL).snapshot())
			a := h.post("/v1/chat/completions", chatBody("chat", false))
			if a.status != 502 || !strings.Contains(a.apiError(t).Error.Message, "engine key") {
				t.Fatalf("only replica refusing: %+v", a)
			}
		})
	}
}

// 429 and 503 from an engine try one other replica when there is one.
func TestBusyEngineTriesOneOther(t *testing.T) {
	busy := newUpstream(t, statusHandler(503))
	good := newUpstream(t, chatOK)
	h := newHarness(t, Config{}, oneDeployment(busy.URL, good.URL).snapshot())
	for range 3 {
		if a := h.post("/v1/chat/completions", chatBody("chat", false)); a.status != 200 {
			t.Fatalf("answer %+v", a)
		}
	}

	b1, b2, b3 := newUpstream(t, statusHandler(429)), newUpstream(t, statusHandler(429)), newUpstream(t, statusHandler(429))
	h = newHarness(t, Config{}, oneDeployment(b1.URL, b2.URL, b3.URL).snapshot())
	a := h.post("/v1/chat/completions", chatBody("chat", false))
	if a.status != 429 || !strings.Contains(a.body, "engine says 429") {
		t.Fatalf("all busy: %+v, want the engine's 429", a)
	}
	if n := b1.hits.Load() + b2.hits.Load() + b3.hits.Load(); n != 2 {
		t.Fatalf("%d attempts, want 2", n)
	}
}

// The engine's key replaces the client's; the client's key never goes
// upstream.
func TestEngineKeyReplacesClientKey(t *testing.T) {
	u := newUpstream(t, chatOK)
	w := oneDeployment(u.URL)
	engineID := "chat-0-" + w.specs["chat"].SpecVersion()
	ks, err := ParseKeys(strings.NewReader("client-key-0123456789 alice\n"))
	if err != nil {
		t.Fatal(err)
	}
	var asked []string
	h := newHarness(t, Config{Keys: ks, EngineKey: func(id string) string { asked = append(asked, id); return "engine-secret" }}, w.snapshot())
	a := h.post("/v1/chat/completions", chatBody("chat", false), "Authorization", "Bearer client-key-0123456789", "X-Request-Id", "r1")
	if a.status != 200 {
		t.Fatalf("answer %+v", a)
	}
	hd := u.lastHeader()
	if got := hd.Get("Authorization"); got != "Bearer engine-secret" || hd.Get("X-Request-Id") != "r1" {
		t.Fatalf("upstream headers %v", hd)
	}
	// Asked for the request, and for the load scrape it started.
	if len(asked) == 0 || slices.ContainsFunc(asked, func(id string) bool { return id != engineID }) {
		t.Fatalf("engine key asked for %v, want %s", asked, engineID)
	}

	// Without an engine key, the client's is still not forwarded.
	h = newHarness(t, Config{Keys: ks}, w.snapshot())
	h.post("/v1/chat/completions", chatBody("chat", false), "Authorization", "Bearer client-key-0123456789")
	if got := u.lastHeader().Get("Authorization"); got != "" {
		t.Fatalf("client key forwarded: %q", got)
	}
}

// The gateway's load scrape presents each engine's own key, as llama.cpp
// demands on /metrics: without it every scrape would fail and the gateway
// would route by the gossiped load alone.
func TestScrapePresentsTheEngineKey(t *testing.T) {
	var badScrapes atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer key-of-chat-0" {
			badScrapes.Add(1)
			http.Error(w, "no key", http.StatusUnauthorized)
			return
		}
		fmt.Fprint(w, "vllm:num_requests_running 5\nvllm:num_requests_waiting 2\n")
	})
	mux.HandleFunc("/v1/", chatOK)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	w := oneDeployment(srv.URL)
	h := newHarness(t, Config{EngineKey: func(id string) string { return "key-of-" + strings.TrimSuffix(id, "-"+w.specs["chat"].SpecVersion()) }}, w.snapshot())
	if a := h.post("/v1/chat/completions", chatBody("chat", false)); a.status != 200 {
		t.Fatalf("answer %+v", a)
	}
	testwait.Until(t, 5*time.Second, "the engine scraped", func() (bool, string) {
		lr := h.gw.routing.Load().routes["chat"][0]
		l := &lr.rep.load
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.haveValue && l.scraped == 7, fmt.Sprint(l.haveValue, l.scraped)
	})
	if n := badScrapes.Load(); n != 0 {
		t.Fatalf("%d scrapes without the engine's key", n)
	}
}

// The least-loaded replica is chosen, by the gateway's own scrape, and its
// in-flight requests count on top of the scraped value.
func TestChoosesLeastLoaded(t *testing.T) {
	hold := make(chan struct{})
	slow := func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hold:
		case <-r.Context().Done():
		}
		chatOK(w, r)
	}
	a, b := newUpstream(t, slow), newUpstream(t, slow)
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Replicas: 2})
	w.node("n1", gossip.StateAlive)
	w.node("n2", gossip.StateAlive)
	// Gossip says chat-0 is busy: 3 requests.
	w.hold(cp{dep: "chat", replica: 0, node: "n1", url: a.URL, load: gossip.ShardLoad{Running: 2, Waiting: 1}})
	w.hold(cp{dep: "chat", replica: 1, node: "n2", url: b.URL})
	h := newHarness(t, Config{Policy: &LeastLoad{}}, w.snapshot())
	// Scrapes would read 0 from both engines; keep them out by marking
	// them just done.
	for _, lr := range h.gw.routing.Load().routes["chat"] {
		e, _ := lr.rep.load.scrapeDue(t0, time.Second)
		lr.rep.load.scrapeDone(e, 0, time.Time{}, false)
	}
	done := make(chan answer, 5)
	for i := range 5 {
		go func() { done <- h.post("/v1/chat/completions", chatBody("chat", false)) }()
		// Each request is chosen before the next is sent.
		testwait.Until(t, 5*time.Second, "request in flight", func() (bool, string) {
			n := a.hits.Load() + b.hits.Load()
			return n == int64(i+1), fmt.Sprint(n)
		})
	}
	close(hold)
	for range 5 {
		<-done
	}
	// chat-1 takes requests until its in-flight count reaches chat-0's
	// gossiped 3; then chat-0 gets its share: of five, chat-1 gets 3 or
	// 4 and chat-0 1 or 2.
	if a.hits.Load() < 1 || a.hits.Load() > 2 || b.hits.Load() < 3 {
		t.Fatalf("chat-0 (load 3) got %d, chat-1 (idle) %d", a.hits.Load(), b.hits.Load())
	}
}

// Events pass byte for byte, whatever their line endings and however long
// a line is (longer than the relay's buffer).
func TestEventsPassByteForByte(t *testing.T) {
	long := strings.Repeat("y", 100<<10)
	stream := "data: {\"a\":1}\r\n\r\n: keep-alive comment\n\nevent: x\ndata: " + long + "\n\ndata: [DONE]\n\n"
	u := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		for _, part := range strings.SplitAfter(stream, "\n") {
			io.WriteString(w, part)
			w.(http.Flusher).Flush()
		}
	})
	h := newHarness(t, Config{}, oneDeployment(u.URL).snapshot())
	if a := h.post("/v1/completions", `{"model":"chat","prompt":"x","stream":true}`); a.status != 200 || a.body != stream {
		t.Fatalf("%d, body of %d bytes, want the %d bytes sent", a.status, len(a.body), len(stream))
	}
}

// Views change while requests run: the table swaps without a lock on the
// request path (run with -race).
func TestUpdateWhileServing(t *testing.T) {
	a, b := newUpstream(t, chatOK), newUpstream(t, chatOK)
	h := newHarness(t, Config{}, oneDeployment(a.URL, b.URL).snapshot())
	stop := make(chan struct{})
	updated := make(chan struct{})
	go func() {
		defer close(updated)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				h.gw.Update(oneDeployment(a.URL).snapshot())
			} else {
				h.gw.Update(oneDeployment(a.URL, b.URL).snapshot())
			}
		}
	}()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				if r := h.post("/v1/chat/completions", chatBody("chat", false)); r.status != 200 {
					t.Errorf("%+v", r)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-updated
	if n := value(t, h.gw.m.requests); n != 80 {
		t.Fatalf("%v requests counted, want 80", n)
	}
}

// The gateway scrapes the engines of a deployment that sees traffic and
// chooses by what they report, counting its own requests since the scrape
// on top.
func TestChoosesByScrapedLoad(t *testing.T) {
	hold := make(chan struct{})
	slow := func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("X-Hold"), "yes") {
			chatOK(w, r)
			return
		}
		select {
		case <-hold:
		case <-r.Context().Done():
		}
		chatOK(w, r)
	}
	busy, idle := newUpstream(t, slow), newUpstream(t, slow)
	busy.running.Store(3)
	h := newHarness(t, Config{Policy: &LeastLoad{}}, oneDeployment(busy.URL, idle.URL).snapshot())
	// The first request starts the scrapes of both engines.
	h.post("/v1/chat/completions", chatBody("chat", false))
	testwait.Until(t, 5*time.Second, "both engines scraped", func() (bool, string) {
		n := 0
		for _, lr := range h.gw.routing.Load().routes["chat"] {
			lr.rep.load.mu.Lock()
			if lr.rep.load.haveValue {
				n++
			}
			lr.rep.load.mu.Unlock()
		}
		return n == 2, fmt.Sprint(n)
	})
	before := busy.hits.Load()
	done := make(chan answer, 5)
	for i := range 5 {
		go func() { done <- h.post("/v1/chat/completions", chatBody("chat", false), "X-Hold", "yes") }()
		testwait.Until(t, 5*time.Second, "request in flight", func() (bool, string) {
			n := busy.hits.Load() + idle.hits.Load()
			return n == int64(i+2), fmt.Sprint(n)
		})
	}
	close(hold)
	for range 5 {
		<-done
	}
	// idle (scraped 0) takes three; at 3 in flight it ties with busy's
	// scraped 3: one of the next two goes to busy, the other to idle.
	if got := busy.hits.Load() - before; got != 1 {
		t.Fatalf("busy got %d of the held requests, idle %d in all", got, idle.hits.Load())
	}
}
