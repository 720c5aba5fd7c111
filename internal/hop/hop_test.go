package hop

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 30, 0, time.UTC)

// received is out as a server receives it (RequestURI set).
func received(out *http.Request) *http.Request {
	in := httptest.NewRequest(out.Method, out.URL.RequestURI(), nil)
	in.Header = out.Header.Clone()
	return in
}

func signed(s *Signer, body string) *http.Request {
	out, _ := http.NewRequest("POST", "http://n2:7070/llmgw/relay/chat-0-abc/v1/chat/completions?x=1", strings.NewReader(body))
	out.Header.Set("Authorization", "Bearer client")
	s.Sign(out, "10.0.0.9:5555", []byte(body))
	return out
}

func TestSignedCallVerifiesOnce(t *testing.T) {
	clk := clock.NewFake(t0)
	s := &Signer{Name: "n1", Key: []byte("k"), Now: clk.Now}
	v := &Verifier{Key: []byte("k"), Now: clk.Now}
	out := signed(s, "body")
	if out.Header.Get("Authorization") != "" {
		t.Error("the caller's Authorization went with the hop")
	}
	from, caller, err := v.Verify(received(out), []byte("body"))
	if err != nil || from != "n1" || caller != "10.0.0.9:5555" {
		t.Fatalf("Verify: %q %q %v", from, caller, err)
	}
	if _, _, err := v.Verify(received(out), []byte("body")); !errors.Is(err, ErrReplayed) {
		t.Fatalf("the same call again: %v, want ErrReplayed", err)
	}
	// Two calls alike in every field but their nonce both pass.
	if _, _, err := v.Verify(received(signed(s, "body")), []byte("body")); err != nil {
		t.Fatalf("a second call of the same body: %v", err)
	}
}

func TestVerifyRefuses(t *testing.T) {
	clk := clock.NewFake(t0)
	s := &Signer{Name: "n1", Key: []byte("k"), Now: clk.Now}
	for _, tc := range []struct {
		name  string
		key   string
		body  string
		mod   func(r *http.Request)
		later time.Duration
	}{
		{name: "another key", key: "other"},
		{name: "another body", body: "bodY"},
		{name: "another caller", mod: func(r *http.Request) { r.Header.Set(CallerHeader, "someone else") }},
		{name: "another node", mod: func(r *http.Request) { r.Header.Set(ForwardedHeader, "n3") }},
		{name: "another nonce", mod: func(r *http.Request) { r.Header.Set(NonceHeader, strings.Repeat("0", 32)) }},
		{name: "no nonce", mod: func(r *http.Request) { r.Header.Del(NonceHeader) }},
		{name: "another path", mod: func(r *http.Request) { r.RequestURI = "/llmgw/relay/chat-1-abc/v1/chat/completions?x=1" }},
		{name: "another method", mod: func(r *http.Request) { r.Method = "GET" }},
		{name: "no signature", mod: func(r *http.Request) { r.Header.Del(Header) }},
		{name: "too old", later: Window + time.Second},
		{name: "from the future", later: -Window - time.Second},
		{name: "no key here", key: "-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := []byte("k")
			switch tc.key {
			case "":
			case "-":
				key = nil
			default:
				key = []byte(tc.key)
			}
			v := &Verifier{Key: key, Now: clock.NewFake(t0.Add(tc.later)).Now}
			in := received(signed(s, "body"))
			if tc.mod != nil {
				tc.mod(in)
			}
			body := "body"
			if tc.body != "" {
				body = tc.body
			}
			if _, _, err := v.Verify(in, []byte(body)); err == nil {
				t.Fatal("verified")
			}
		})
	}
}

// Nonces are forgotten once their signatures lapse, so the guard's memory
// is bounded by the calls of two windows; a full guard refuses rather
// than accept unchecked.
func TestReplayGuardForgetsAndIsBounded(t *testing.T) {
	clk := clock.NewFake(t0)
	s := &Signer{Name: "n1", Key: []byte("k"), Now: clk.Now}
	v := &Verifier{Key: []byte("k"), Now: clk.Now, MaxNonces: 3}
	for i := range 3 {
		if _, _, err := v.Verify(received(signed(s, "b")), []byte("b")); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	old := signed(s, "b")
	if _, _, err := v.Verify(received(old), []byte("b")); !errors.Is(err, ErrGuardFull) {
		t.Fatalf("a fourth call with room for 3: %v, want ErrGuardFull", err)
	}
	clk.Advance(2*Window + time.Minute)
	if _, _, err := v.Verify(received(signed(s, "b")), []byte("b")); err != nil {
		t.Fatalf("a call once the others lapsed: %v", err)
	}
	if v.count != 1 {
		t.Errorf("%d nonces remembered, want 1", v.count)
	}
}
