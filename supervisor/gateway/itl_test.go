package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A streamed answer through the gateway, from the fake engine at a known
// token delay, is timed token to token on the node's /metrics: one
// observation per token after the first (the role chunk, the finish and
// usage chunks and [DONE] pass uncounted), each about the delay; a plain
// answer adds none.
func TestInterTokenLatency(t *testing.T) {
	const (
		delay  = 20 * time.Millisecond
		tokens = 8
	)
	h := fakeEngineGateway(t, delay)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(h.gw)

	// itl is the histogram's count and sum for model "chat", as /metrics
	// exports it (0, 0 before its first observation).
	itl := func() (uint64, float64) {
		t.Helper()
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != "llmgw_gateway_inter_token_latency_seconds" {
				continue
			}
			for _, m := range f.GetMetric() {
				if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "model" {
					t.Fatalf("labels %v, want model alone", l)
				}
				if m.GetLabel()[0].GetValue() == "chat" {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
		return 0, 0
	}

	var count uint64
	var sum float64
	for _, c := range []struct{ path, body string }{
		// A chat stream: the role chunk (content ""), the tokens, the
		// finish chunk ({}), the usage chunk, [DONE].
		{"/v1/chat/completions", `{"model":"chat","stream":true,"stream_options":{"include_usage":true},"max_tokens":8,"ignore_eos":true,"messages":[{"role":"user","content":"one two three"}]}`},
		// A completion stream: the tokens, the finish chunk (text ""), [DONE].
		{"/v1/completions", `{"model":"chat","stream":true,"max_tokens":8,"ignore_eos":true,"prompt":"one two three"}`},
	} {
		a := h.post(c.path, c.body)
		if a.status != 200 || !strings.HasSuffix(a.body, "data: [DONE]\n\n") {
			t.Fatalf("%s: %d %s", c.path, a.status, a.body)
		}
		// Every observation was made before [DONE] was written.
		n, s := itl()
		n, s = n-count, s-sum
		count, sum = count+n, sum+s
		if n != tokens-1 {
			t.Fatalf("%s: %d inter-token observations, want %d (a stream of %d tokens):\n%s", c.path, n, tokens-1, tokens, a.body)
		}
		if mean := time.Duration(s / float64(n) * float64(time.Second)); mean < delay/2 || mean > 5*delay {
			t.Fatalf("%s: mean inter-token latency %v, want about the engine's %v", c.path, mean, delay)
		}
	}

	if a := h.post("/v1/chat/completions", `{"model":"chat","max_tokens":8,"ignore_eos":true,"messages":[{"role":"user","content":"one two three"}]}`); a.status != 200 {
		t.Fatalf("plain: %d %s", a.status, a.body)
	}
	if n, _ := itl(); n != count {
		t.Fatalf("a plain answer observed %d inter-token latencies", n-count)
	}
}

// carriesToken tells the events with output from those without, as the
// engines write them (compact, or with spaces as Python's json does).
func TestCarriesToken(t *testing.T) {
	for ev, want := range map[string]bool{
		`data: {"choices":[{"index":0,"delta":{"content":" word"},"finish_reason":null}]}`:               true,
		`data: {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": null}]}`:            true,
		`data: {"choices":[{"index":0,"text":" word","finish_reason":null}]}`:                            true,
		`data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}`:                                       true,
		`data: {"choices":[{"delta":{"reasoning":"hm"}}]}`:                                               true,
		`data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city"}}]}}]}`:  true,
		`data: {"choices":[{"delta":{"content":"\"content\":\"\""}}]}`:                                   true,
		`data: {"choices":[{"delta":{"role":"assistant","content":""},"finish_reason":null}]}`:           false,
		`data: {"choices":[{"delta":{},"finish_reason":"stop"}]}`:                                        false,
		`data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]}`:                             false,
		`data: {"choices":[{"delta":{"content":null},"finish_reason":"stop"}]}`:                          false,
		`data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":8,"total_tokens":13}}`:       false,
		`data: {"choices":[{"delta":{"content":[{"type":"text"}]}}]}`:                                    false,
		`data: {"error":{"message":"the \"content\" was too long","type":"BadRequestError","code":400}}`: false,
		`data: [DONE]`:      false,
		`: keep-alive`:      false,
		`data: {"content":`: false,
	} {
		if got := carriesToken([]byte(ev + "\n\n")); got != want {
			t.Errorf("carriesToken(%s) = %v, want %v", ev, got, want)
		}
	}
	// It reads every event of every stream: nothing allocated.
	ev := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"chat","choices":[{"delta":{},"finish_reason":"stop","index":0,"logprobs":null}]}` + "\n\n")
	if allocs := testing.AllocsPerRun(100, func() { carriesToken(ev) }); allocs != 0 {
		t.Fatalf("carriesToken allocated %v times", allocs)
	}
}
