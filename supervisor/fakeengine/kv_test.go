package fakeengine

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// pdServer is an engine of a disaggregated pair, its side channel (or
// bootstrap port) on a loopback listener.
func pdServer(t *testing.T, cfg Config) (*httptest.Server, *Server) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.KV.Listener = ln
	if cfg.KV.nixl() {
		cfg.KV.SideChannelHost = "127.0.0.1"
	}
	s, err := NewServer(cfg)
	if err != nil {
		_ = ln.Close()
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return ts, s
}

func nixl(engineID string) KVTransfer {
	return KVTransfer{Connector: "NixlConnector", Role: "kv_both", EngineID: engineID}
}

// postJSON posts body with an X-Request-Id and decodes the JSON answer.
func postJSON(t *testing.T, url, reqID string, body any) (int, map[string]any, string) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", url, strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	if reqID != "" {
		req.Header.Set("X-Request-Id", reqID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m, string(raw)
}

// leg1 is the body vLLM's toy proxy sends to the prefill
// (toy_proxy_server.py send_request_to_service).
func leg1(prompt string) map[string]any {
	return map[string]any{
		"model": "m", "prompt": prompt, "stream": false, "max_tokens": 1,
		"kv_transfer_params": map[string]any{
			"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
			"remote_block_ids": nil, "remote_host": nil, "remote_port": nil,
		},
	}
}

// prompt40 is 40 tokens: two full blocks of 16 and a partial one.
var prompt40 = strings.Repeat("abcd", 40)

func TestNixlPrefillAnswer(t *testing.T) {
	kv := nixl("engine-p")
	kv.TPSize = 2
	ts, s := pdServer(t, Config{Model: "m", KV: kv})
	port := s.kv.ln.Addr().(*net.TCPAddr).Port

	code, got, raw := postJSON(t, ts.URL+"/v1/completions", "req-1", leg1(prompt40))
	if code != 200 {
		t.Fatalf("prefill leg: %d %s", code, raw)
	}
	if got["id"] != "cmpl-req-1" {
		t.Errorf("id %v, want cmpl-req-1 (X-Request-Id)", got["id"])
	}
	want := map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false,
		"remote_block_ids": []any{0.0, 1.0}, "remote_engine_id": "engine-p",
		"remote_request_id": "cmpl-req-1", "remote_host": "127.0.0.1",
		"remote_port": float64(port), "tp_size": 2.0,
	}
	if !reflect.DeepEqual(got["kv_transfer_params"], want) {
		t.Errorf("kv_transfer_params\n got %v\nwant %v", got["kv_transfer_params"], want)
	}
	if s.HeldKVRequests() != 1 {
		t.Errorf("held %d, want 1", s.HeldKVRequests())
	}

	// A prompt shorter than a block has no blocks to hold.
	_, got, _ = postJSON(t, ts.URL+"/v1/completions", "req-2", leg1("tiny"))
	if p, _ := got["kv_transfer_params"].(map[string]any); p == nil || !reflect.DeepEqual(p["remote_block_ids"], []any{}) {
		t.Errorf("short prompt: kv_transfer_params %v, want empty remote_block_ids", got["kv_transfer_params"])
	}
	// A request that is no prefill leg, or not length-capped, gets null.
	for _, body := range []map[string]any{
		{"model": "m", "prompt": prompt40, "max_tokens": 1},
		func() map[string]any { b := leg1(prompt40); b["max_tokens"] = 100; return b }(),
	} {
		_, got, raw = postJSON(t, ts.URL+"/v1/completions", "", body)
		if v, ok := got["kv_transfer_params"]; !ok || v != nil {
			t.Errorf("kv_transfer_params should be null: %s", raw)
		}
	}
	if s.HeldKVRequests() != 1 {
		t.Errorf("held %d, want still 1", s.HeldKVRequests())
	}
	fams := scrape(t, ts.URL)
	if v := value(t, fams, MetricKVPrefillRequests, "m"); v != 3 {
		t.Errorf("%s = %v, want 3 prefill legs", MetricKVPrefillRequests, v)
	}
	if v := labelled(t, fams, MetricKVRecomputed, "reason", RecomputeNoParams); v != 1 {
		t.Errorf("%s = %v, want the plain request", MetricKVRecomputed, v)
	}
}

// decodeBody is leg 2: the client's body plus the prefill's params.
func decodeBody(params any, stream bool) map[string]any {
	return map[string]any{"model": "m", "prompt": prompt40, "max_tokens": 5, "ignore_eos": true, "stream": stream, "kv_transfer_params": params}
}

func TestNixlDecodeLoadsFromPrefill(t *testing.T) {
	prec, drec := &recorder{}, &recorder{}
	pts, ps := pdServer(t, Config{Model: "m", KV: nixl("p"), PrefillPer1KTokens: time.Second, Sleep: prec.Sleep})
	dkv := nixl("d")
	dkv.TransferPer1KTokens = 500 * time.Millisecond
	dts, _ := pdServer(t, Config{Model: "m", KV: dkv, PrefillBase: time.Hour, PrefillPer1KTokens: time.Second, TokenDelay: time.Millisecond, Sleep: drec.Sleep})

	_, got, _ := postJSON(t, pts.URL+"/v1/completions", "r", leg1(prompt40))
	if d := prec.take(); !reflect.DeepEqual(d, []time.Duration{40 * time.Millisecond}) {
		t.Errorf("prefill's delays %v, want its prefill of 40 tokens", d)
	}
	code, _, raw := postJSON(t, dts.URL+"/v1/completions", "r", decodeBody(got["kv_transfer_params"], true))
	if code != 200 || !strings.Contains(raw, "data: [DONE]") || strings.Contains(raw, `"error"`) {
		t.Fatalf("decode leg: %d %s", code, raw)
	}
	// The transfer (40 tokens at 0.5 s per 1k), then four decode steps:
	// no prefill.
	want := []time.Duration{20 * time.Millisecond, time.Millisecond, time.Millisecond, time.Millisecond, time.Millisecond}
	if d := drec.take(); !reflect.DeepEqual(d, want) {
		t.Errorf("decode's delays %v, want %v", d, want)
	}
	if ps.HeldKVRequests() != 0 {
		t.Error("the prefill still holds the blocks its decode read")
	}
	pf, df := scrape(t, pts.URL), scrape(t, dts.URL)
	for _, c := range []struct {
		name   string
		fams   string
		source string
		want   float64
	}{
		{"prefill", "p", SourceLocalCompute, 40}, {"prefill", "p", SourceExternalKV, 0},
		{"decode", "d", SourceLocalCompute, 0}, {"decode", "d", SourceExternalKV, 40},
	} {
		fams := pf
		if c.fams == "d" {
			fams = df
		}
		if v := labelled(t, fams, MetricPromptTokensBySource, "source", c.source); v != c.want {
			t.Errorf("%s: %s{source=%s} = %v, want %v", c.name, MetricPromptTokensBySource, c.source, v, c.want)
		}
	}
	if v := value(t, df, MetricKVTransfers, "m"); v != 1 {
		t.Errorf("decode's %s = %v, want 1", MetricKVTransfers, v)
	}

	// The blocks were read once: a second decode of them fails.
	code, body, raw := postJSON(t, dts.URL+"/v1/completions", "r", decodeBody(got["kv_transfer_params"], false))
	if code != 500 || !reflect.DeepEqual(body["error"], map[string]any{"message": "Internal server error", "type": "InternalServerError", "param": nil, "code": 500.0}) {
		t.Errorf("second read: %d %s", code, raw)
	}
}

// labelled is a counter's value for one label value.
func labelled(t *testing.T, fams map[string]*dto.MetricFamily, name, label, val string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == val {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("metric %s has no %s=%q", name, label, val)
	return 0
}

// A decode sent to blocks that are not there fails the request under
// "fail" (vLLM's default) and computes the prompt itself under
// "recompute", counting it.
func TestNixlLoadFailurePolicy(t *testing.T) {
	pts, _ := pdServer(t, Config{Model: "m", KV: nixl("p")})
	_, got, _ := postJSON(t, pts.URL+"/v1/completions", "r", leg1(prompt40))
	params := got["kv_transfer_params"].(map[string]any)
	params["remote_request_id"] = "cmpl-unknown"

	for _, policy := range []string{"fail", "recompute"} {
		t.Run(policy, func(t *testing.T) {
			rec := &recorder{}
			kv := nixl("d")
			kv.LoadFailurePolicy = policy
			dts, _ := pdServer(t, Config{Model: "m", KV: kv, PrefillBase: time.Hour, Sleep: rec.Sleep})
			code, _, raw := postJSON(t, dts.URL+"/v1/completions", "x", decodeBody(params, false))
			streamCode, _, streamed := postJSON(t, dts.URL+"/v1/completions", "y", decodeBody(params, true))
			fams := scrape(t, dts.URL)
			if v := labelled(t, fams, MetricKVLoadFailures, "reason", LoadFailMissing); v != 2 {
				t.Errorf("%s{reason=missing} = %v, want 2", MetricKVLoadFailures, v)
			}
			if v := value(t, fams, MetricNixlFailedTransfers, "m"); v != 2 {
				t.Errorf("%s = %v, want 2", MetricNixlFailedTransfers, v)
			}
			recomputed := labelled(t, fams, MetricKVRecomputed, "reason", RecomputeLoadFailure)
			prefilled := 0
			for _, d := range rec.take() {
				if d == time.Hour {
					prefilled++
				}
			}
			if policy == "fail" {
				if code != 500 || !strings.Contains(raw, `"message":"Internal server error"`) {
					t.Errorf("non-streamed: %d %s", code, raw)
				}
				if streamCode != 200 || streamed != "data: {\"error\":{\"code\":500,\"message\":\"Internal server error\",\"param\":null,\"type\":\"InternalServerError\"}}\n\ndata: [DONE]\n\n" {
					t.Errorf("streamed: %d %q", streamCode, streamed)
				}
				if recomputed != 0 || prefilled != 0 {
					t.Errorf("recomputed %v, prefills %d: want none", recomputed, prefilled)
				}
				return
			}
			if code != 200 || streamCode != 200 || strings.Contains(streamed, `"error"`) {
				t.Errorf("recompute: %d %s / %d %s", code, raw, streamCode, streamed)
			}
			if recomputed != 2 || prefilled != 2 {
				t.Errorf("recomputed %v, prefills %d: want 2 each", recomputed, prefilled)
			}
		})
	}
}

// A decode whose handshake finds another compatibility hash (another
// engine version) refuses the transfer, as vLLM's handshake does; a
// prefill told to fail its transfers fails them.
func TestNixlHandshakeMismatchAndTransferFailure(t *testing.T) {
	for _, c := range []struct {
		name           string
		pVer, dVer     string
		failTransfers  bool
		noEnforce      bool
		reason         string
		wantStatusCode int
	}{
		{name: "same version", pVer: "0.11.0", dVer: "0.11.0", wantStatusCode: 200},
		{name: "version mismatch", pVer: "0.11.0", dVer: "0.12.0", reason: LoadFailHandshake, wantStatusCode: 500},
		{name: "mismatch, check off", pVer: "0.11.0", dVer: "0.12.0", noEnforce: true, wantStatusCode: 200},
		{name: "transfer failure", failTransfers: true, reason: LoadFailTransfer, wantStatusCode: 500},
	} {
		t.Run(c.name, func(t *testing.T) {
			pkv := nixl("p")
			pkv.CompatVersion, pkv.FailTransfers = c.pVer, c.failTransfers
			pts, _ := pdServer(t, Config{Model: "m", KV: pkv})
			dkv := nixl("d")
			dkv.CompatVersion, dkv.NoEnforceCompat = c.dVer, c.noEnforce
			var log syncBuffer
			dts, _ := pdServer(t, Config{Model: "m", KV: dkv, Log: &log})
			_, got, _ := postJSON(t, pts.URL+"/v1/completions", "r", leg1(prompt40))
			code, _, raw := postJSON(t, dts.URL+"/v1/completions", "r", decodeBody(got["kv_transfer_params"], false))
			if code != c.wantStatusCode {
				t.Fatalf("decode: %d %s, want %d", code, raw, c.wantStatusCode)
			}
			if c.reason == "" {
				return
			}
			if v := labelled(t, scrape(t, dts.URL), MetricKVLoadFailures, "reason", c.reason); v != 1 {
				t.Errorf("%s{reason=%s} = %v, want 1", MetricKVLoadFailures, c.reason, v)
			}
			if c.reason == LoadFailHandshake && !strings.Contains(log.String(), "NIXL compatibility hash mismatch. Local: ") {
				t.Errorf("log lacks vLLM's mismatch error: %s", log.String())
			}
		})
	}
}

// syncBuffer is a Log for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// A prefill frees unread blocks once VLLM_NIXL_ABORT_REQUEST_TIMEOUT has
// passed, counting them expired; a decode arriving later finds nothing.
func TestNixlLeaseExpiry(t *testing.T) {
	clk := &testClock{t: time.Unix(1000, 0)}
	pts, ps := pdServer(t, Config{Model: "m", KV: nixl("p"), Now: clk.Now, KVCacheBlocks: 100})
	dkv := nixl("d")
	dts, _ := pdServer(t, Config{Model: "m", KV: dkv})
	_, got, _ := postJSON(t, pts.URL+"/v1/completions", "r", leg1(prompt40))
	if _, _, kv := ps.sched.load(); kv != 0.02 {
		t.Errorf("kv usage %v with two blocks held of 100, want 0.02", kv)
	}
	clk.Advance(DefaultNixlAbortRequestTimeout - time.Second)
	if ps.HeldKVRequests() != 1 {
		t.Fatal("blocks freed before the lease ran out")
	}
	clk.Advance(time.Second)
	if ps.HeldKVRequests() != 0 {
		t.Fatal("blocks still held after the lease ran out")
	}
	if _, _, kv := ps.sched.load(); kv != 0 {
		t.Errorf("kv usage %v after the lease, want 0", kv)
	}
	if v := value(t, scrape(t, pts.URL), MetricNixlExpiredReqs, "m"); v != 1 {
		t.Errorf("%s = %v, want 1", MetricNixlExpiredReqs, v)
	}
	code, _, raw := postJSON(t, dts.URL+"/v1/completions", "r", decodeBody(got["kv_transfer_params"], false))
	if code != 500 {
		t.Errorf("decode after expiry: %d %s", code, raw)
	}
	if v := labelled(t, scrape(t, dts.URL), MetricKVLoadFailures, "reason", LoadFailMissing); v != 1 {
		t.Errorf("decode's %s{reason=missing} = %v, want 1", MetricKVLoadFailures, v)
	}
}

// A decode-side engine serving a request without kv_transfer_params
// computes the prompt itself and counts it.
func TestNixlNoParamsCounted(t *testing.T) {
	rec := &recorder{}
	ts, _ := pdServer(t, Config{Model: "m", KV: nixl("d"), PrefillBase: time.Hour, Sleep: rec.Sleep})
	if code, _, raw := postJSON(t, ts.URL+"/v1/chat/completions", "", map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "hi"}}}); code != 200 {
		t.Fatalf("%d %s", code, raw)
	}
	if d := rec.take(); len(d) != 1 || d[0] != time.Hour {
		t.Errorf("delays %v, want its own prefill", d)
	}
	fams := scrape(t, ts.URL)
	if v := labelled(t, fams, MetricKVRecomputed, "reason", RecomputeNoParams); v != 1 {
		t.Errorf("%s{reason=no_params} = %v, want 1", MetricKVRecomputed, v)
	}
	if v := labelled(t, fams, MetricPromptTokensBySource, "source", SourceLocalCompute); v == 0 {
		t.Error("no local_compute tokens")
	}
}

// kvSleep is the Sleep of the SGLang tests: the disaggregation timeouts
// (exactly timeout long) block until ctx ends, or pass at once when
// expire is set; every other delay passes at once and is recorded.
type kvSleep struct {
	recorder
	timeout time.Duration
	expire  bool
}

func (k *kvSleep) Sleep(ctx context.Context, d time.Duration) bool {
	if d == k.timeout {
		if k.expire {
			return true
		}
		<-ctx.Done()
		return false
	}
	return k.recorder.Sleep(ctx, d)
}

func sglangPD(mode string, timeout time.Duration) KVTransfer {
	return KVTransfer{Mode: mode, BootstrapTimeout: timeout, WaitingTimeout: timeout, TransferPer1KTokens: 500 * time.Millisecond}
}

// SGLang's pair: the same body, with its bootstrap room, goes to both at
// once; the decode meets the prefill through its bootstrap port, gets the
// KV and answers without a prefill; the prefill answers its first token.
func TestSGLangPairMeetsThroughBootstrap(t *testing.T) {
	const timeout = 7 * time.Minute
	ps, ds := &kvSleep{timeout: timeout}, &kvSleep{timeout: timeout}
	pts, psrv := pdServer(t, Config{Model: "m", Personality: PersonalitySGLang, SGLangCheapHealth: true, KV: sglangPD("prefill", timeout), PrefillBase: 30 * time.Second, Sleep: ps.Sleep})
	dts, _ := pdServer(t, Config{Model: "m", Personality: PersonalitySGLang, SGLangCheapHealth: true, KV: sglangPD("decode", timeout), PrefillBase: 30 * time.Second, Sleep: ds.Sleep})
	port := psrv.kv.ln.Addr().(*net.TCPAddr).Port
	room := uint64(1<<63 - 1)
	body := map[string]any{
		"model": "m", "prompt": prompt40, "max_tokens": 5, "ignore_eos": true,
		"bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": room,
	}
	type answer struct {
		code int
		m    map[string]any
		raw  string
	}
	var wg sync.WaitGroup
	var pa, da answer
	wg.Add(2)
	go func() { defer wg.Done(); pa.code, pa.m, pa.raw = postJSON(t, pts.URL+"/v1/completions", "", body) }()
	go func() { defer wg.Done(); da.code, da.m, da.raw = postJSON(t, dts.URL+"/v1/completions", "", body) }()
	wg.Wait()
	if pa.code != 200 || da.code != 200 {
		t.Fatalf("prefill %d %s\ndecode %d %s", pa.code, pa.raw, da.code, da.raw)
	}
	if u := da.m["usage"].(map[string]any); u["completion_tokens"] != 5.0 {
		t.Errorf("decode's usage %v, want 5 tokens", u)
	}
	if u := pa.m["usage"].(map[string]any); u["completion_tokens"] != 1.0 {
		t.Errorf("prefill's usage %v, want its first token only", u)
	}
	if d := ps.take(); !reflect.DeepEqual(d, []time.Duration{30 * time.Second}) {
		t.Errorf("prefill's delays %v, want its prefill", d)
	}
	if d := ds.take(); !reflect.DeepEqual(d, []time.Duration{20 * time.Millisecond}) {
		t.Errorf("decode's delays %v, want the transfer alone", d)
	}
	if v := value(t, scrape(t, dts.URL), MetricKVTransfers, "m"); v != 1 {
		t.Errorf("decode's %s = %v", MetricKVTransfers, v)
	}
	if v := value(t, scrape(t, pts.URL), MetricKVPrefillRequests, "m"); v != 1 {
		t.Errorf("prefill's %s = %v", MetricKVPrefillRequests, v)
	}
}

// Each half alone fails once its timeout passes, with SGLang's words and
// counters.
func TestSGLangTimeouts(t *testing.T) {
	const timeout = 7 * time.Minute
	pts, psrv := pdServer(t, Config{Model: "m", Personality: PersonalitySGLang, SGLangCheapHealth: true, KV: sglangPD("prefill", timeout), Sleep: (&kvSleep{timeout: timeout, expire: true}).Sleep})
	dts, _ := pdServer(t, Config{Model: "m", Personality: PersonalitySGLang, SGLangCheapHealth: true, KV: sglangPD("decode", timeout), Sleep: (&kvSleep{timeout: timeout, expire: true}).Sleep})
	body := map[string]any{
		"model": "m", "prompt": prompt40, "max_tokens": 5,
		"bootstrap_host": "127.0.0.1", "bootstrap_port": psrv.kv.ln.Addr().(*net.TCPAddr).Port, "bootstrap_room": 42,
	}
	code, m, raw := postJSON(t, pts.URL+"/v1/completions", "", body)
	if code != 500 || !strings.HasPrefix(m["error"].(map[string]any)["message"].(string), "Request 42 timed out after ") || !strings.HasSuffix(raw, "waiting for decode handshake\",\"param\":null,\"type\":\"InternalServerError\"}}\n") {
		t.Errorf("prefill alone: %d %s", code, raw)
	}
	body["bootstrap_room"] = 43
	code, _, raw = postJSON(t, dts.URL+"/v1/completions", "", body)
	if code != 500 || !strings.Contains(raw, "Request 43 timed out after ") || !strings.Contains(raw, "waiting for KV transfer") {
		t.Errorf("decode alone: %d %s", code, raw)
	}
	if v := value(t, scrape(t, pts.URL), MetricSGLangBootstrapFailed, "m"); v != 1 {
		t.Errorf("%s = %v", MetricSGLangBootstrapFailed, v)
	}
	if v := value(t, scrape(t, dts.URL), MetricSGLangTransferFailed, "m"); v != 1 {
		t.Errorf("%s = %v", MetricSGLangTransferFailed, v)
	}
}

// With step interference a prefill of T tokens delays a running decode's
// next token by T × the per-token prefill time; without, not at all.
func TestStepInterference(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(map[bool]string{false: "off", true: "on"}[on], func(t *testing.T) {
			g := newGate()
			ts, _ := newTestServer(t, Config{Model: "m", PrefillPer1KTokens: time.Second, TokenDelay: 10 * time.Millisecond,
				NoPrefixCaching: true, StepInterference: on, Sleep: g.Sleep})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var a async
			a.post(ctx, ts.URL+"/v1/completions", `{"model":"m","prompt":"abcd","max_tokens":3,"ignore_eos":true}`)
			if h := g.next(t); h.d != time.Millisecond {
				t.Fatalf("A's prefill %v", h.d)
			} else {
				close(h.pass)
			}
			step := g.next(t) // A's second token, held
			if step.d != 10*time.Millisecond {
				t.Fatalf("A's second token %v", step.d)
			}
			a.post(ctx, ts.URL+"/v1/completions", `{"model":"m","prompt":"`+strings.Repeat("abcd", 1000)+`","max_tokens":1}`)
			if h := g.next(t); h.d != time.Second {
				t.Fatalf("B's prefill %v", h.d)
			} else {
				close(h.pass)
			}
			close(step.pass)
			want := 10 * time.Millisecond
			if on {
				want += time.Second
			}
			h := g.next(t)
			close(h.pass)
			if h.d != want {
				t.Errorf("A's third token waited %v, want %v", h.d, want)
			}
			for _, c := range a.wait() {
				if c != 200 {
					t.Errorf("status %d", c)
				}
			}
		})
	}
}

// The real engines' disaggregation flags and variables reach KVTransfer,
// with their defaults; what the real engine refuses, the fake refuses.
func TestParseDisaggregation(t *testing.T) {
	cfg, _, err := ParseCommandLine(PersonalityVLLM, []string{"serve", "m", "--tensor-parallel-size", "4",
		"--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"recompute","engine_id":"e1","kv_buffer_device":"cuda"}`},
		env(map[string]string{"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.5", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601",
			"VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "60", EnvKVCompatVersion: "v2", EnvStepInterference: "1", EnvKVTransferPer1KTokens: "7ms"}))
	if err != nil {
		t.Fatal(err)
	}
	want := KVTransfer{Connector: "NixlConnector", Role: "kv_both", LoadFailurePolicy: "recompute", EngineID: "e1",
		SideChannelHost: "10.0.0.5", SideChannelPort: 5601, TPSize: 4, AbortRequestTimeout: time.Minute,
		TransferPer1KTokens: 7 * time.Millisecond, CompatVersion: "v2"}
	if !reflect.DeepEqual(cfg.KV, want) || !cfg.StepInterference {
		t.Errorf("vllm:\n got %+v (step interference %v)\nwant %+v", cfg.KV, cfg.StepInterference, want)
	}
	cfg, _, err = ParseCommandLine(PersonalityVLLM, []string{"serve", "m", "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}`}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if k := cfg.KV; k.LoadFailurePolicy != "fail" || k.SideChannelHost != "localhost" || k.SideChannelPort != 5600 ||
		k.AbortRequestTimeout != 480*time.Second || k.TPSize != 1 || len(k.EngineID) != 36 || k.TransferPer1KTokens != DefaultKVTransferPer1K {
		t.Errorf("vllm defaults: %+v", k)
	}
	cfg, _, err = ParseCommandLine(PersonalitySGLang, strings.Fields("--model-path m --disaggregation-mode decode --disaggregation-transfer-backend nixl --disaggregation-bootstrap-port 9000"),
		env(map[string]string{"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "5", EnvKVTransferFail: "true"}))
	if err != nil {
		t.Fatal(err)
	}
	want = KVTransfer{Mode: "decode", TransferBackend: "nixl", BootstrapPort: 9000, BootstrapTimeout: 300 * time.Second,
		WaitingTimeout: 5 * time.Second, TransferPer1KTokens: DefaultKVTransferPer1K, FailTransfers: true}
	if !reflect.DeepEqual(cfg.KV, want) {
		t.Errorf("sglang:\n got %+v\nwant %+v", cfg.KV, want)
	}
	for _, bad := range []struct {
		p    Personality
		args []string
		msg  string
	}{
		{PersonalityVLLM, []string{"serve", "m", "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"both"}`}, "Unsupported kv_role: both"},
		{PersonalityVLLM, []string{"serve", "m", "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both","nope":1}`}, `unknown field "nope"`},
		{PersonalityVLLM, []string{"serve", "m", "--kv-transfer-config", `{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`}, "NixlConnector only"},
		{PersonalityVLLM, []string{"serve", "m", "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"retry"}`}, "want fail or recompute"},
		{PersonalitySGLang, strings.Fields("--model-path m --disaggregation-mode both"), "invalid choice: 'both'"},
		{PersonalitySGLang, strings.Fields("--model-path m --disaggregation-mode prefill --disaggregation-transfer-backend ucx"), "mooncake and nixl"},
	} {
		if _, _, err := ParseCommandLine(bad.p, bad.args, env(nil)); err == nil || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("%v: error %v, want one saying %q", bad.args, err, bad.msg)
		}
	}
}

// Run opens the side channel where the variables say, and a decode
// reaches it there.
func TestRunOpensSideChannel(t *testing.T) {
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	_ = probe.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	httpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		done <- Run(ctx, Config{Model: "m", Listener: httpLn, KV: KVTransfer{Connector: "NixlConnector", Role: "kv_both",
			SideChannelHost: "127.0.0.1", SideChannelPort: port}})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	_, got, raw := postJSON(t, "http://"+httpLn.Addr().String()+"/v1/completions", "", leg1(prompt40))
	p, _ := got["kv_transfer_params"].(map[string]any)
	if p == nil || p["remote_port"] != float64(port) || p["remote_host"] != "127.0.0.1" {
		t.Fatalf("prefill answer %s", raw)
	}
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("side channel not listening: %v", err)
	}
	_ = c.Close()
}
