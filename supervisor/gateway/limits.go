package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// callers holds each API key's limiters. They outlive a reload of the keys
// file (SetKeys), so a SIGHUP neither refills a drained bucket nor forgets
// requests in flight.
type callers struct {
	mu sync.Mutex
	by map[[sha256.Size]byte]*caller
}

type caller struct {
	lim      Limits
	bucket   *rate.Limiter // nil: no rate limit
	inflight int
}

func newCallers() *callers { return &callers{by: map[[sha256.Size]byte]*caller{}} }

// admit takes one request of key k at now, or refuses it with 429 and how
// long to wait. release must be called when the request ends.
func (cs *callers) admit(k *apiKey, now time.Time) (release func(), err *apiError) {
	if k.lim == (Limits{}) {
		return func() {}, nil
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c := cs.by[k.sum]
	if c == nil || c.lim != k.lim {
		nc := &caller{lim: k.lim}
		if k.lim.RPS > 0 {
			burst := k.lim.Burst
			if burst == 0 {
				burst = max(1, int(k.lim.RPS+0.999))
			}
			nc.bucket = rate.NewLimiter(rate.Limit(k.lim.RPS), burst)
			nc.bucket.SetBurstAt(now, burst)
		}
		if c != nil {
			nc.inflight = c.inflight
		}
		c = nc
		cs.by[k.sum] = c
	}
	if c.lim.Concurrent > 0 && c.inflight >= c.lim.Concurrent {
		return nil, errKeyLimit(k, fmt.Sprintf("%d requests in flight, the key's limit (concurrency=%d)", c.inflight, c.lim.Concurrent), time.Second)
	}
	if c.bucket != nil && !c.bucket.AllowN(now, 1) {
		wait := time.Duration((1 - c.bucket.TokensAt(now)) / c.lim.RPS * float64(time.Second))
		return nil, errKeyLimit(k, fmt.Sprintf("over the key's rate (rps=%g)", c.lim.RPS), max(wait, time.Second))
	}
	c.inflight++
	return func() {
		cs.mu.Lock()
		c.inflight--
		cs.mu.Unlock()
	}, nil
}

// forget drops the limiters of keys no longer in ks.
func (cs *callers) forget(ks *KeySet) {
	keep := map[[sha256.Size]byte]bool{}
	if ks != nil {
		for _, k := range ks.keys {
			keep[k.sum] = true
		}
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for sum := range cs.by {
		if !keep[sum] {
			delete(cs.by, sum)
		}
	}
}

func errKeyLimit(k *apiKey, why string, wait time.Duration) *apiError {
	return &apiError{status: http.StatusTooManyRequests, typ: typeRate, code: "key_rate_limited", retryAfter: wait,
		message: fmt.Sprintf("API key %s: %s; retry after the Retry-After header's seconds", k.label(), why)}
}

// usage is the token counts an engine reports in an answer's "usage".
type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

var usageKey = []byte(`"usage"`)

// usageOf reads the top-level usage of one JSON answer or stream chunk;
// ok is false when it has none (most stream chunks).
func usageOf(doc []byte) (u usage, ok bool) {
	if !bytes.Contains(doc, usageKey) {
		return u, false
	}
	var at span
	if scanObject(doc, func(key []byte, v span) {
		if string(key) == "usage" {
			at = v
		}
	}) != nil || !at.ok() || doc[at.start] != '{' {
		return u, false
	}
	return u, json.Unmarshal(doc[at.start:at.end], &u) == nil
}

// eventData returns the data of a server-sent event (its "data:" lines
// joined), for reading usage out of the final chunk.
func eventData(ev []byte) []byte {
	var out []byte
	for line := range bytes.Lines(ev) {
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			out = append(out, bytes.TrimSpace(d)...)
		}
	}
	return out
}
