package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/hop"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
)

var relayKey = []byte("relay key of the test cluster")

func testEngineKey(id string) string { return "engine-key-" + id }

// relayWorld is deployment "chat" with one replica whose engine (up)
// listens on n2's loopback only; n2's API serves the relay. The gateway
// under test runs on n1 and signs with signKey.
type relayWorld struct {
	up    *upstream
	relay *Relay
	api   *httptest.Server
	h     *harness
	w     *world
}

func newRelayWorld(t *testing.T, engine http.HandlerFunc, signKey []byte) *relayWorld {
	t.Helper()
	rw := &relayWorld{up: newUpstream(t, engine)}
	port := rw.up.Listener.Addr().(*net.TCPAddr).Port
	rw.relay = NewRelay(RelayConfig{
		Verifier:  &hop.Verifier{Key: relayKey, Now: clock.NewFake(t0).Now},
		EngineKey: testEngineKey,
		Local: func(id string) (LocalEngine, bool) {
			if !strings.HasPrefix(id, "chat-0-") {
				return LocalEngine{}, false
			}
			return LocalEngine{Port: port, MetricsPath: "/metrics"}, true
		},
	})
	mux := http.NewServeMux()
	mux.Handle(rw.relay.Pattern(), rw.relay)
	rw.api = httptest.NewServer(mux)
	t.Cleanup(rw.api.Close)

	rw.w = newWorld()
	rw.w.ttl = time.Hour // leases outlast the fake clock's moves
	rw.w.deploy(placement.Deployment{Name: "chat"})
	rw.w.node("n1", gossip.StateAlive)
	rw.w.node("n2", gossip.StateAlive)
	rw.w.members["n2"].Record.API = rw.api.Listener.Addr().String()
	// The record names the holder's address, where nothing listens for
	// the engine: only the relay reaches it.
	rw.w.hold(cp{dep: "chat", node: "n2", url: fmt.Sprintf("http://192.0.2.77:%d", port), private: true})
	rw.h = newHarness(t, Config{EngineKey: testEngineKey, Relay: &hop.Signer{Name: "n1", Key: signKey, Now: clock.NewFake(t0).Now}},
		rw.w.snapshot())
	return rw
}

// A replica whose engine listens on another node's loopback is reached
// through that node's relay: the answer comes back whole, the engine sees
// its own key (presented by the holder) and none of the hop's headers or
// the client's key.
func TestRelayCarriesARequestToAnotherNodesEngine(t *testing.T) {
	rw := newRelayWorld(t, chatOK, relayKey)
	a := rw.h.post("/v1/chat/completions", chatBody("chat", false), "Authorization", "Bearer client-key")
	if a.status != http.StatusOK || !strings.Contains(a.body, `"content":"hi"`) {
		t.Fatalf("through the relay: %d %s", a.status, a.body)
	}
	if a.header.Get("Llmgw-Node") != "n2" {
		t.Errorf("Llmgw-Node %q, want n2", a.header.Get("Llmgw-Node"))
	}
	hdr := rw.up.lastHeader()
	if got, want := hdr.Get("Authorization"), "Bearer "+testEngineKey(rw.engineID()); got != want {
		t.Errorf("the engine saw Authorization %q, want its own key %q", got, want)
	}
	for _, k := range []string{hop.Header, hop.NonceHeader, hop.CallerHeader, hop.ForwardedHeader} {
		if hdr.Get(k) != "" {
			t.Errorf("the engine saw the hop's header %s: %q", k, hdr.Get(k))
		}
	}
}

// Prometheus scrapes an engine through its holder, with no credentials
// (it cannot add a header per target): the holder presents the engine's
// key, which llama.cpp demands on /metrics, and passes the page and its
// content type through. An engine not held there is a 404.
func TestEngineMetricsThroughTheHolder(t *testing.T) {
	const page = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" || r.Header.Get("Authorization") != "Bearer "+testEngineKey("chat-0-v1") {
			http.Error(w, "Invalid API Key", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		io.WriteString(w, page)
	}))
	t.Cleanup(engine.Close)
	relay := NewRelay(RelayConfig{
		Verifier:  &hop.Verifier{Key: relayKey, Now: clock.NewFake(t0).Now},
		EngineKey: testEngineKey,
		Local: func(id string) (LocalEngine, bool) {
			return LocalEngine{Port: engine.Listener.Addr().(*net.TCPAddr).Port, MetricsPath: "/metrics"}, id == "chat-0-v1"
		},
	})
	mux := http.NewServeMux()
	mux.HandleFunc(MetricsPattern, relay.ServeMetrics)
	api := httptest.NewServer(mux)
	t.Cleanup(api.Close)
	get := func(path string) (int, string, string) {
		resp, err := http.Get(api.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	if code, ct, body := get("/v1/engines/chat-0-v1/metrics"); code != http.StatusOK || body != page || !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("held engine: %d %q %q, want 200 text/plain and the engine's page", code, ct, body)
	}
	if code, _, body := get("/v1/engines/other-0-v1/metrics"); code != http.StatusNotFound {
		t.Errorf("engine not held here: %d %q, want 404", code, body)
	}
}

func (rw *relayWorld) engineID() string {
	for _, e := range rw.h.gw.routing.Load().table.entries {
		for _, r := range e.Routes {
			return r.EngineID
		}
	}
	return ""
}

// A gateway whose key differs (another cluster token) is refused by the
// relay, which answers 401 before the engine is reached; the gateway
// counts it against the replica, as it does an engine refusing its key.
func TestRelayRefusesAnotherClustersGateway(t *testing.T) {
	rw := newRelayWorld(t, chatOK, []byte("some other token's relay key"))
	a := rw.h.post("/v1/chat/completions", chatBody("chat", false))
	if a.status == http.StatusOK || rw.up.hits.Load() != 0 {
		t.Fatalf("a wrongly signed relay reached the engine: %d %s (engine hits %d)", a.status, a.body, rw.up.hits.Load())
	}
}

// What reaches the relay without a valid signature, or signed once and
// sent again, or for a path the gateway never sends, never reaches the
// engine.
func TestRelayRefusesUnsignedReplayedAndOtherPaths(t *testing.T) {
	rw := newRelayWorld(t, chatOK, relayKey)
	id := rw.engineID()
	base := rw.api.URL + RelayPath + id
	body := chatBody("chat", false)
	send := func(req *http.Request) int {
		t.Helper()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	newReq := func(method, path, body string) *http.Request {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return req
	}
	signer := &hop.Signer{Name: "n1", Key: relayKey, Now: clock.NewFake(t0).Now}

	if code := send(newReq("POST", "/v1/chat/completions", body)); code != http.StatusUnauthorized {
		t.Errorf("unsigned: %d, want 401", code)
	}
	// The engine's key is no credential at the relay.
	req := newReq("POST", "/v1/chat/completions", body)
	req.Header.Set("Authorization", "Bearer "+testEngineKey(id))
	if code := send(req); code != http.StatusUnauthorized {
		t.Errorf("with the engine's key and no signature: %d, want 401", code)
	}
	// A signature covers the body: another body is refused.
	req = newReq("POST", "/v1/chat/completions", chatBody("chat", true))
	signer.Sign(req, "c", []byte(body))
	if code := send(req); code != http.StatusUnauthorized {
		t.Errorf("signed for another body: %d, want 401", code)
	}
	// vLLM's paths outside /v1 run the model without its key: the relay
	// forwards none of them, signed or not.
	for _, p := range []string{"/invocations", "/pooling", "/score", "/tokenize", "/v1/models", "/reset_prefix_cache"} {
		req := newReq("POST", p, body)
		signer.Sign(req, "c", []byte(body))
		if code := send(req); code != http.StatusNotFound {
			t.Errorf("signed POST %s: %d, want 404", p, code)
		}
	}
	if n := rw.up.hits.Load(); n != 0 {
		t.Fatalf("%d requests reached the engine", n)
	}
	// Signed once: served once.
	req = newReq("POST", "/v1/chat/completions", body)
	signer.Sign(req, "c", []byte(body))
	again := req.Clone(context.Background())
	again.Body = io.NopCloser(strings.NewReader(body))
	if code := send(req); code != http.StatusOK {
		t.Fatalf("signed: %d, want 200", code)
	}
	if code := send(again); code != http.StatusUnauthorized {
		t.Errorf("the same signed request again: %d, want 401 (a replay)", code)
	}
	if n := rw.up.hits.Load(); n != 1 {
		t.Errorf("the engine ran %d requests, want 1", n)
	}
	// A gateway's load scrape: GET of the engine's metrics path, signed.
	req = newReq("GET", "/metrics", "")
	signer.Sign(req, "scrape", nil)
	if code := send(req); code != http.StatusOK {
		t.Errorf("signed GET /metrics: %d, want 200", code)
	}
	if code := send(newReq("GET", "/metrics", "")); code != http.StatusUnauthorized {
		t.Errorf("unsigned GET /metrics: %d, want 401", code)
	}
	// An engine not held here: 502, which the calling gateway retries
	// elsewhere.
	req, _ = http.NewRequest("POST", rw.api.URL+RelayPath+"other-0-abc/v1/chat/completions", strings.NewReader(body))
	signer.Sign(req, "c", []byte(body))
	if code := send(req); code != http.StatusBadGateway {
		t.Errorf("an engine this node does not run: %d, want 502", code)
	}
	for result, want := range map[string]float64{"relayed": 2, "refused": 5, "path": 6, "no_engine": 1} {
		if got := value(t, rw.relay.results.WithLabelValues(result)); got != want {
			t.Errorf("llmgw_relay_requests_total{result=%q} = %v, want %v", result, got, want)
		}
	}
}

// The relay passes a stream on as the engine writes it: the client has
// the first event while the engine still holds the rest back.
func TestRelayStreamsWithoutBuffering(t *testing.T) {
	release := make(chan struct{})
	rw := newRelayWorld(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"first\"}}]}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}, relayKey)
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", rw.h.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody("chat", true)))
	resp, err := rw.h.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, "first") {
		t.Fatalf("first event: %q, %v (the relay held the stream back?)", line, err)
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if !bytes.Contains(rest, []byte("[DONE]")) {
		t.Fatalf("the stream's end: %q", rest)
	}
}

// An engine on this node that listens on loopback only is dialled at
// 127.0.0.1, not at the address of its record; another node's goes
// through that node's relay.
func TestPrivateRoutes(t *testing.T) {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Replicas: 2})
	w.node("n1", gossip.StateAlive)
	w.node("n2", gossip.StateAlive)
	w.members["n1"].Record.API = "10.0.0.1:7070"
	w.members["n2"].Record.API = "10.0.0.2:7070"
	w.hold(cp{dep: "chat", replica: 0, node: "n1", url: "http://10.0.0.1:8100", private: true})
	w.hold(cp{dep: "chat", replica: 1, node: "n2", url: "http://10.0.0.2:8101", private: true})
	tab := BuildTable(w.snapshot(), t0)
	routes := tab.entries["chat"].Routes
	if len(routes) != 2 {
		t.Fatalf("routes %+v", routes)
	}
	if r := routes[0]; r.Local != "http://127.0.0.1:8100" || r.URL != "http://10.0.0.1:8100" || r.Relay != "" {
		t.Errorf("own private engine: local %q URL %q relay %q, want http://127.0.0.1:8100, its record's and none", r.Local, r.URL, r.Relay)
	}
	if r, want := routes[1], "http://10.0.0.2:7070"+RelayPath+routes[1].EngineID; r.Relay != want {
		t.Errorf("another node's private engine: relay %q, want %q", r.Relay, want)
	}
	// Every gateway names a replica alike, wherever it dials it from, so
	// the prefix policy's hashing picks the same one on every node.
	other := BuildTable(w.snapshotOf("n2", t0), t0).entries["chat"].Routes
	if len(other) != len(routes) || other[0].Relay == "" || other[1].Local == "" {
		t.Fatalf("n2's routes %+v", other)
	}
	for i := range routes {
		if routes[i].key() != other[i].key() {
			t.Errorf("n1 keys a replica %q, n2 %q", routes[i].key(), other[i].key())
		}
	}
	// Without the holder's API address there is no way to it.
	w.members["n2"].Record.API = ""
	if routes := BuildTable(w.snapshot(), t0).entries["chat"].Routes; len(routes) != 1 || routes[0].Node != "n1" {
		t.Errorf("routes without the holder's API: %+v", routes)
	}
	// An engine from before cluster version 4 listens on every address
	// and is dialled at its record's URL, as older gateways do.
	w2 := oneDeployment("http://10.0.0.1:8100")
	if r := BuildTable(w2.snapshot(), t0).entries["chat"].Routes[0]; r.URL != "http://10.0.0.1:8100" || r.Relay != "" || r.Local != "" {
		t.Errorf("a public engine: %+v", r)
	}
}

// A stopping node waits for what it relays.
func TestRelayWaitsForRequestsInFlight(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	rw := newRelayWorld(t, func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		chatOK(w, r)
	}, relayKey)
	done := make(chan answer, 1)
	go func() { done <- rw.h.post("/v1/chat/completions", chatBody("chat", false)) }()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if rw.relay.Wait(ctx) {
		t.Error("Wait returned while a request was being relayed")
	}
	cancel()
	close(release)
	if a := <-done; a.status != http.StatusOK {
		t.Fatalf("%d %s", a.status, a.body)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !rw.relay.Wait(ctx) {
		t.Error("Wait did not return once the relay was idle")
	}
}

// While a holder's agent restarts, its relay refuses connections and its
// engine serves on under a valid lease: a request whose every replica is
// behind such a relay waits for it (Config.RelayHold) instead of failing.
func TestRequestWaitsForARestartingHoldersRelay(t *testing.T) {
	rw := newRelayWorld(t, chatOK, relayKey)
	addr := rw.api.Listener.Addr().String()
	rw.api.Close() // the agent is down: connections refused
	done := make(chan answer, 1)
	go func() { done <- rw.h.post("/v1/chat/completions", chatBody("chat", false)) }()
	// The request waits on the gateway's clock, its attempts refused.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rw.h.clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("the request does not wait for the relay: %v", err)
	}
	select {
	case a := <-done:
		t.Fatalf("answered while the relay was down: %d %s", a.status, a.body)
	default:
	}
	// The agent is back, on the same address.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(rw.relay.Pattern(), rw.relay)
	back := httptest.NewUnstartedServer(mux)
	back.Listener = ln
	back.Start()
	defer back.Close()
	// The gateway's clock moves on until the request is answered.
	step := func(d time.Duration) answer {
		var a answer
		testwait.Until(t, 10*time.Second, "the request is answered", func() (bool, string) {
			select {
			case a = <-done:
				return true, ""
			default:
				rw.h.clock.Advance(d)
				return false, "waiting"
			}
		})
		return a
	}
	if a := step(50 * time.Millisecond); a.status != http.StatusOK {
		t.Fatalf("once the relay was back: %d %s", a.status, a.body)
	}
	// A relay that stays down fails the request once the hold is over.
	back.Close()
	start := rw.h.clock.Now()
	go func() { done <- rw.h.post("/v1/chat/completions", chatBody("chat", false)) }()
	a := step(50 * time.Millisecond)
	if a.status != http.StatusBadGateway && a.status != http.StatusServiceUnavailable {
		t.Fatalf("a relay down for good: %d %s, want 502 or 503", a.status, a.body)
	}
	if waited := rw.h.clock.Since(start); waited < DefaultRelayHold {
		t.Errorf("answered after %v of the gateway's clock, want at least the relay hold (%v)", waited, DefaultRelayHold)
	}
}

// prefer chooses the candidate on node, when there is one.
type prefer string

func (p prefer) Choose(_ *Request, cands []Candidate) Choice {
	for i, c := range cands {
		if c.Route.Node == string(p) {
			return Choice{Index: i}
		}
	}
	return Choice{}
}

func (p prefer) Name() string { return "prefer-" + string(p) }

// A holder that falls silent (frozen, dead) takes the requests it relays
// with it, though its engine may serve on: once its lease lapses, a
// request waiting on its relay is cut and tried on another replica.
func TestSilentHolderCutsTheRequestsItRelays(t *testing.T) {
	entered := make(chan struct{}, 1)
	rw := newRelayWorld(t, func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-r.Context().Done() // a relay that never answers
	}, relayKey)
	local := newUpstream(t, chatOK)
	rw.w.specs["chat"] = rw.w.deploy(placement.Deployment{Name: "chat", Replicas: 2})
	rw.w.members["n2"].Record.Shards = nil
	rw.w.nodes["n2"].Shards = nil
	rw.w.plan.Assignments = nil
	port := rw.up.Listener.Addr().(*net.TCPAddr).Port
	rw.w.hold(cp{dep: "chat", replica: 0, node: "n2", url: fmt.Sprintf("http://192.0.2.77:%d", port), private: true})
	rw.w.hold(cp{dep: "chat", replica: 1, node: "n1", url: local.URL})
	h := newHarness(t, Config{EngineKey: testEngineKey, Policy: prefer("n2"),
		Relay: &hop.Signer{Name: "n1", Key: relayKey, Now: clock.NewFake(t0).Now}}, rw.w.snapshot())
	done := make(chan answer, 1)
	go func() { done <- h.post("/v1/chat/completions", chatBody("chat", false)) }()
	<-entered
	// n2 is heard no more; its lease lapses a TTL later.
	rw.w.lastSeen = map[string]time.Time{"n2": t0}
	h.clock.Advance(2 * time.Hour)
	h.gw.Update(rw.w.snapshotAt(h.clock.Now()))
	var a answer
	select {
	case a = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the request still waits on the silent holder's relay")
	}
	if a.status != http.StatusOK || a.header.Get("Llmgw-Node") != "n1" {
		t.Fatalf("%d from %q: %s; want 200 from n1", a.status, a.header.Get("Llmgw-Node"), a.body)
	}
}
