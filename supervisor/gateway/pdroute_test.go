package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/fakeengine"
)

// recorder keeps the bodies and request IDs an engine was sent.
type recorder struct {
	mu     sync.Mutex
	bodies []map[string]json.RawMessage
	ids    []string
}

func (r *recorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.HasPrefix(req.URL.Path, "/v1/") {
			b, _ := io.ReadAll(req.Body)
			var m map[string]json.RawMessage
			_ = json.Unmarshal(b, &m)
			r.mu.Lock()
			r.bodies = append(r.bodies, m)
			r.ids = append(r.ids, req.Header.Get("X-Request-Id"))
			r.mu.Unlock()
			req.Body = io.NopCloser(bytes.NewReader(b))
		}
		h.ServeHTTP(w, req)
	})
}

func (r *recorder) sent() ([]map[string]json.RawMessage, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]json.RawMessage(nil), r.bodies...), append([]string(nil), r.ids...)
}

// pdFake is a fake engine serving deployment pd in one of the P/D
// protocols, its KV port on a loopback listener; the port is returned.
func pdFake(t *testing.T, kv fakeengine.KVTransfer) (*httptest.Server, *recorder, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	kv.Listener = ln
	if kv.Connector != "" {
		kv.SideChannelHost = "127.0.0.1"
	}
	s, err := fakeengine.NewServer(fakeengine.Config{Model: "pd", KV: kv})
	if err != nil {
		_ = ln.Close()
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	rec := &recorder{}
	ts := httptest.NewServer(rec.wrap(s))
	t.Cleanup(ts.Close)
	return ts, rec, ln.Addr().(*net.TCPAddr).Port
}

// pdWorld is deployment pd of one prefill and one decode replica, on n1
// and n2.
func pdWorld(engine, preURL, decURL string, kvPort int, transfer *placement.Transfer) *world {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "pd", Engine: engine, Prefill: &placement.Role{Replicas: 1}, Decode: &placement.Role{Replicas: 1}, Transfer: transfer})
	w.node("n1", gossip.StateAlive)
	w.node("n2", gossip.StateAlive)
	if preURL != "" {
		w.hold(cp{dep: "pd", replica: 0, role: placement.RolePrefill, node: "n1", url: preURL, kvPort: kvPort})
	}
	w.hold(cp{dep: "pd", replica: 0, role: placement.RoleDecode, node: "n2", url: decURL})
	return w
}

// longChat is a chat whose prompt spans several KV blocks.
func longChat(stream bool) string {
	return fmt.Sprintf(`{"model":"pd","stream":%t,"max_tokens":4,"messages":[{"role":"user","content":%q}]}`, stream, strings.Repeat("the quick brown fox ", 30))
}

// vLLM's protocol through the gateway: the prefill leg as the toy proxy
// sends it, the decode leg with the prefill's parameters verbatim, one
// request ID on both; the decode loads the KV over the prefill's side
// channel, and the outcome is counted.
func TestPDRoutesNixlLegs(t *testing.T) {
	pre, preRec, _ := pdFake(t, fakeengine.KVTransfer{Connector: "NixlConnector", Role: "kv_both", EngineID: "engine-p"})
	dec, decRec, _ := pdFake(t, fakeengine.KVTransfer{Connector: "NixlConnector", Role: "kv_both", EngineID: "engine-d"})
	h := newHarness(t, Config{}, pdWorld("fake", pre.URL, dec.URL, 0, nil).snapshot())
	type tokens struct {
		Prompt     int `json:"prompt_tokens"`
		Completion int `json:"completion_tokens"`
	}
	var usage tokens
	for _, stream := range []bool{false, true} {
		a := h.post("/v1/chat/completions", longChat(stream))
		if a.status != 200 {
			t.Fatalf("stream %v: %d %s", stream, a.status, a.body)
		}
		if !stream {
			var ans struct {
				Usage tokens `json:"usage"`
			}
			_ = json.Unmarshal([]byte(a.body), &ans)
			usage = ans.Usage
		}
		if stream && !strings.Contains(a.body, "data: [DONE]") {
			t.Errorf("the stream did not end: %s", a.body)
		}
	}
	pb, pids := preRec.sent()
	db, dids := decRec.sent()
	if len(pb) != 2 || len(db) != 2 {
		t.Fatalf("prefill saw %d legs, decode %d; want 2 each", len(pb), len(db))
	}
	for i := range 2 {
		if string(pb[i]["kv_transfer_params"]) != `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}` ||
			string(pb[i]["stream"]) != "false" || string(pb[i]["max_tokens"]) != "1" {
			t.Errorf("prefill leg %d: %v", i, pb[i])
		}
		var p struct {
			DoRemotePrefill bool   `json:"do_remote_prefill"`
			EngineID        string `json:"remote_engine_id"`
			Blocks          []int  `json:"remote_block_ids"`
		}
		if err := json.Unmarshal(db[i]["kv_transfer_params"], &p); err != nil || !p.DoRemotePrefill || p.EngineID != "engine-p" || len(p.Blocks) == 0 {
			t.Errorf("decode leg %d's kv_transfer_params: %s", i, db[i]["kv_transfer_params"])
		}
		if string(db[i]["max_tokens"]) != "4" {
			t.Errorf("decode leg %d lost the client's max_tokens: %v", i, db[i])
		}
		if pids[i] == "" || pids[i] != dids[i] {
			t.Errorf("leg %d: request IDs %q and %q, want one on both", i, pids[i], dids[i])
		}
	}
	if v := value(t, h.gw.m.pdRequests.WithLabelValues("pd", pdDisaggregated)); v != 2 {
		t.Errorf("disaggregated %v, want 2", v)
	}
	if got := metricLine(t, dec.URL, "fakeengine_kv_transfers_total"); got != 2 {
		t.Errorf("the decode loaded %v prompts from the prefill, want 2", got)
	}
	// The client's usage counts the prompt once, as the prefill computed
	// it, and the decode's tokens.
	if prompts := metricLine(t, pre.URL, "vllm:prompt_tokens_total"); usage.Prompt == 0 || float64(2*usage.Prompt) != prompts || usage.Completion != 4 {
		t.Errorf("usage %+v; the prefill computed %v prompt tokens in two requests", usage, prompts)
	}
}

// metricLine reads one unlabelled-by-us counter of an engine's /metrics.
func metricLine(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, name+"{") || strings.HasPrefix(l, name+" ") {
			var v float64
			_, _ = fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &v)
			return v
		}
	}
	return -1
}

// Nothing is silent: without a ready prefill, with a prefill of another
// spec version, or with a prefill that answers no kv_transfer_params, the
// request fails with an error that says so, or, with transfer.fallback,
// decode serves it alone; each is counted by its outcome.
func TestPDNeverFallsBackSilently(t *testing.T) {
	dec, decRec, _ := pdFake(t, fakeengine.KVTransfer{Connector: "NixlConnector", Role: "kv_both", EngineID: "engine-d"})
	noParams := newUpstream(t, chatOK)
	for _, tc := range []struct {
		name     string
		world    func(fallback bool) *world
		outcome  string
		say      string
		decodeIn bool // decode serves alone with fallback
	}{
		{"no prefill", func(fb bool) *world { return pdWorld("fake", "", dec.URL, 0, &placement.Transfer{Fallback: fb}) }, pdFailed, "no prefill replica is ready", true},
		{"other version", func(fb bool) *world {
			w := pdWorld("fake", "", dec.URL, 0, &placement.Transfer{Fallback: fb})
			w.hold(cp{dep: "pd", replica: 0, role: placement.RolePrefill, node: "n1", url: noParams.URL, spec: "0123456789ab"})
			return w
		}, pdVersionMismatch, "no prefill replica of the decode's spec version", true},
		{"no params", func(fb bool) *world {
			return pdWorld("fake", noParams.URL, dec.URL, 0, &placement.Transfer{Fallback: fb})
		}, pdNoParams, "answered without kv_transfer_params", true},
	} {
		h := newHarness(t, Config{}, tc.world(false).snapshot())
		a := h.post("/v1/chat/completions", longChat(false))
		if a.status != http.StatusServiceUnavailable || a.apiError(t).Error.Code != "disaggregation_failed" || !strings.Contains(a.body, tc.say) || !strings.Contains(a.body, "transfer.fallback is off") {
			t.Errorf("%s: %d %s", tc.name, a.status, a.body)
		}
		if v := value(t, h.gw.m.pdRequests.WithLabelValues("pd", tc.outcome)); v != 1 {
			t.Errorf("%s: outcome %s counted %v times, want 1", tc.name, tc.outcome, v)
		}
		if why := h.gw.PDOutcomes()["pd"][tc.outcome]; !strings.Contains(why, tc.say) {
			t.Errorf("%s: the reason kept for llmgw models: %q", tc.name, why)
		}
		before, _ := decRec.sent()
		h = newHarness(t, Config{}, tc.world(true).snapshot())
		a = h.post("/v1/chat/completions", longChat(false))
		if a.status != 200 {
			t.Errorf("%s with fallback: %d %s", tc.name, a.status, a.body)
		}
		// The cause is counted where there is one; a prefill that could
		// not serve at all is the fallback itself.
		outcome := tc.outcome
		if outcome == pdFailed {
			outcome = pdFallback
		}
		if v := value(t, h.gw.m.pdRequests.WithLabelValues("pd", outcome)); v != 1 {
			t.Errorf("%s with fallback: %s counted %v times", tc.name, outcome, v)
		}
		after, _ := decRec.sent()
		if len(after) != len(before)+1 || after[len(after)-1]["kv_transfer_params"] != nil {
			t.Errorf("%s with fallback: decode was not sent the client's body alone", tc.name)
		}
	}
}

// /v1/models lists a disaggregated deployment once a decode and a prefill
// replica are ready, or a decode alone with the fallback.
func TestPDModelsListsARoutableUnit(t *testing.T) {
	dec := newUpstream(t, chatOK)
	listed := func(w *world) bool {
		h := newHarness(t, Config{}, w.snapshot())
		a := h.do(context.Background(), http.MethodGet, "/v1/models", "")
		return strings.Contains(a.body, `"id":"pd"`)
	}
	if listed(pdWorld("fake", "", dec.URL, 0, nil)) {
		t.Error("listed with a decode replica alone")
	}
	if !listed(pdWorld("fake", dec.URL, dec.URL, 0, nil)) {
		t.Error("not listed with both roles ready")
	}
	if !listed(pdWorld("fake", "", dec.URL, 0, &placement.Transfer{Fallback: true})) {
		t.Error("not listed with a decode alone and the fallback")
	}
}

// A rolling update: the new decode is ready before the new prefill. The
// gateway pairs the old decode with the old prefill instead of choosing
// the new decode and finding no prefill of its version.
func TestPDPairsVersionsDuringARollout(t *testing.T) {
	pre, _, _ := pdFake(t, fakeengine.KVTransfer{Connector: "NixlConnector", Role: "kv_both", EngineID: "engine-p"})
	oldDec, oldRec, _ := pdFake(t, fakeengine.KVTransfer{Connector: "NixlConnector", Role: "kv_both", EngineID: "engine-d"})
	newDec, newRec, _ := pdFake(t, fakeengine.KVTransfer{Connector: "NixlConnector", Role: "kv_both", EngineID: "engine-d2"})
	w := newWorld()
	w.deploy(placement.Deployment{Name: "pd", Prefill: &placement.Role{Replicas: 1}, Decode: &placement.Role{Replicas: 1}})
	w.node("n1", gossip.StateAlive)
	w.node("n2", gossip.StateAlive)
	const old = "0123456789ab"
	w.hold(cp{dep: "pd", role: placement.RolePrefill, node: "n1", url: pre.URL, spec: old, drain: true})
	w.hold(cp{dep: "pd", role: placement.RoleDecode, node: "n2", url: oldDec.URL, spec: old, drain: true})
	w.hold(cp{dep: "pd", role: placement.RoleDecode, node: "n1", url: newDec.URL})
	h := newHarness(t, Config{}, w.snapshot())
	for i := range 4 {
		if a := h.post("/v1/chat/completions", strings.Replace(longChat(false), "the quick", fmt.Sprint(i), 1)); a.status != 200 {
			t.Fatalf("request %d during the rollout: %d %s", i, a.status, a.body)
		}
	}
	ob, _ := oldRec.sent()
	nb, _ := newRec.sent()
	if o, n := len(ob), len(nb); o != 4 || n != 0 {
		t.Errorf("old decode %d, new decode %d requests; want every one on the old pair", o, n)
	}
	if v := value(t, h.gw.m.pdRequests.WithLabelValues("pd", pdDisaggregated)); v != 4 {
		t.Errorf("disaggregated %v of 4", v)
	}
}

// The leg bound bounds a plain decode's answer no more than the engine's
// own bound does: a plain answer's first byte is its last, and a long
// generation is not a stuck transfer.
func TestPDPlainDecodeOutlivesTheLegBound(t *testing.T) {
	pre, _, _ := pdFake(t, fakeengine.KVTransfer{Connector: "NixlConnector", Role: "kv_both", EngineID: "engine-p"})
	release := make(chan struct{})
	dec := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		chatOK(w, r)
	})
	h := newHarness(t, Config{PDLegTimeout: 5 * time.Second}, pdWorld("fake", pre.URL, dec.URL, 0, nil).snapshot())
	done := make(chan answer, 1)
	go func() { done <- h.post("/v1/chat/completions", longChat(false)) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for dec.hits.Load() == 0 {
		if ctx.Err() != nil {
			t.Fatal("the decode leg never reached the decode")
		}
		if err := h.clock.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	h.clock.Advance(time.Minute) // far past the leg bound, within the engine's
	close(release)
	if a := <-done; a.status != 200 {
		t.Errorf("a plain decode answering after the leg bound: %d %s", a.status, a.body)
	}
}

// A prefill that refuses the gateway's engine key is ejected and the leg
// goes to another prefill: the client never sees the engine's 401.
func TestPDPrefillRefusingTheKeyIsSkipped(t *testing.T) {
	pre, _, _ := pdFake(t, fakeengine.KVTransfer{Connector: "NixlConnector", Role: "kv_both", EngineID: "engine-p"})
	dec, _, _ := pdFake(t, fakeengine.KVTransfer{Connector: "NixlConnector", Role: "kv_both", EngineID: "engine-d"})
	refusing := newUpstream(t, statusHandler(http.StatusUnauthorized))
	w := pdWorld("fake", pre.URL, dec.URL, 0, nil)
	w.hold(cp{dep: "pd", replica: 1, role: placement.RolePrefill, node: "n2", url: refusing.URL})
	h := newHarness(t, Config{}, w.snapshot())
	for i := range 6 {
		if a := h.post("/v1/chat/completions", strings.Replace(longChat(false), "the quick", fmt.Sprint(i), 1)); a.status != 200 {
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
	}
	if refusing.hits.Load() != 1 {
		t.Errorf("the refusing prefill was asked %d times, want once (then ejected)", refusing.hits.Load())
	}
	if v := value(t, h.gw.m.ejections.WithLabelValues("pd", "pd-p1", reasonAuth)); v != 1 {
		t.Errorf("ejections of pd-p1 for its key: %v", v)
	}
}

// A prefill leg that does not answer ends at the P/D leg bound with an
// OpenAI error, not at the engines' 300 s.
func TestPDPrefillLegTimeout(t *testing.T) {
	stuck := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	dec, _, _ := pdFake(t, fakeengine.KVTransfer{Connector: "NixlConnector", Role: "kv_both", EngineID: "engine-d"})
	h := newHarness(t, Config{PDLegTimeout: 5 * time.Second}, pdWorld("fake", stuck.URL, dec.URL, 0, nil).snapshot())
	done := make(chan answer, 1)
	go func() { done <- h.post("/v1/chat/completions", longChat(false)) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for stuck.hits.Load() == 0 {
		if ctx.Err() != nil {
			t.Fatal("the prefill leg never reached the prefill")
		}
		if err := h.clock.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	h.clock.Advance(5 * time.Second)
	select {
	case a := <-done:
		if a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, "did not answer within 5s") {
			t.Errorf("%d %s", a.status, a.body)
		}
	case <-ctx.Done():
		t.Fatal("the request outlived the leg bound")
	}
	if v := value(t, h.gw.m.pdRequests.WithLabelValues("pd", pdFailed)); v != 1 {
		t.Errorf("failed counted %v times", v)
	}
}

// SGLang's protocol through the gateway: one body with the prefill's
// bootstrap address and a room to both; the decode meets the prefill
// there. A prefill that fails ends the decode's wait at once.
func TestPDRoutesSGLangBootstrap(t *testing.T) {
	kv := func(mode string) fakeengine.KVTransfer {
		return fakeengine.KVTransfer{Mode: mode, BootstrapTimeout: time.Minute, WaitingTimeout: time.Minute}
	}
	pre, preRec, port := pdFake(t, kv("prefill"))
	dec, decRec, _ := pdFake(t, kv("decode"))
	// The first draw is the request's ID, the second its room.
	rooms := []uint64{42, 1<<63 + 7}
	next := 0
	h := newHarness(t, Config{Rand: func() uint64 { r := rooms[next%len(rooms)]; next++; return r }}, pdWorld("sglang", pre.URL, dec.URL, port, nil).snapshot())
	a := h.post("/v1/chat/completions", longChat(false))
	if a.status != 200 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	pb, _ := preRec.sent()
	db, _ := decRec.sent()
	if len(pb) != 1 || len(db) != 1 {
		t.Fatalf("prefill %d, decode %d requests", len(pb), len(db))
	}
	for _, b := range []map[string]json.RawMessage{pb[0], db[0]} {
		if string(b["bootstrap_host"]) != `"127.0.0.1"` || string(b["bootstrap_port"]) != fmt.Sprint(port) || string(b["bootstrap_room"]) != "7" {
			t.Errorf("bootstrap fields %s %s %s, want 127.0.0.1, %d and the room below 2^63", b["bootstrap_host"], b["bootstrap_port"], b["bootstrap_room"], port)
		}
	}
	if got := metricLine(t, dec.URL, "fakeengine_kv_transfers_total"); got != 1 {
		t.Errorf("decode transfers %v, want 1", got)
	}

	// The prefill fails: the decode, waiting on its room, is let go.
	failing := newUpstream(t, statusHandler(500))
	h = newHarness(t, Config{}, pdWorld("sglang", failing.URL, dec.URL, port, nil).snapshot())
	start := time.Now()
	a = h.post("/v1/chat/completions", longChat(false))
	if a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, "the prefill leg failed") {
		t.Errorf("failing prefill: %d %s", a.status, a.body)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("a failed prefill took %v to answer", took)
	}

	// Two prefills, one failing: a pair whose prefill fails is sent again
	// with a new room to the other, and the client sees no failure.
	w := pdWorld("sglang", pre.URL, dec.URL, port, nil)
	w.hold(cp{dep: "pd", replica: 1, role: placement.RolePrefill, node: "n1", url: failing.URL, kvPort: port})
	h = newHarness(t, Config{}, w.snapshot())
	for i := range 6 {
		body := strings.Replace(longChat(false), "the quick", fmt.Sprintf("%d the quick", i), 1)
		if a := h.post("/v1/chat/completions", body); a.status != 200 {
			t.Errorf("request %d beside a failing prefill: %d %s", i, a.status, a.body)
		}
	}
	if failing.hits.Load() == 0 {
		t.Error("no request met the failing prefill: the retry was not exercised")
	}
	if v := value(t, h.gw.m.pdRequests.WithLabelValues("pd", pdDisaggregated)); v != 6 {
		t.Errorf("disaggregated %v of 6", v)
	}
}
