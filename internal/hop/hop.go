// Package hop signs the calls one node makes to another on a caller's
// behalf, and checks them where they arrive.
//
// Node-to-node calls never carry the cluster token: they go to an address
// learned from gossip. The sending node signs the call instead, with a key
// derived from the token for one purpose (internal/secret.HopKey); the
// receiving node, holding the same token, checks it. A signature covers
// every field its meaning depends on (method, target, forwarding node,
// caller, the body's digest, the time, and for a call that must not run
// twice a nonce), each written with its length, so no two different calls
// sign the same bytes.
//
// supervisor signs logs, MCP and weights lookups with MAC; the gateway's
// relay to an engine on another node (purpose "relay") uses Signer and
// Verifier, which add a nonce and refuse a call seen before (Replay): a
// captured inference request replayed within the window would run the
// model again.
package hop

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The headers a signed call carries.
const (
	// Header carries "<unix seconds>.<hex HMAC-SHA256>".
	Header = "X-Llmgw-Hop"
	// CallerHeader names the caller the forwarding node checked (its
	// address, or its gateway key's name).
	CallerHeader = "X-Llmgw-Caller"
	// ForwardedHeader names the forwarding node.
	ForwardedHeader = "X-Llmgw-Forwarded"
	// NonceHeader carries a signed call's nonce (Signer only): 32 hex
	// characters, new for every call.
	NonceHeader = "X-Llmgw-Nonce"
)

// Window is how far the two nodes' clocks may differ, and so how long a
// signature is good for either side of its time.
const Window = time.Minute

// MAC signs fields, each written with its length.
func MAC(key []byte, fields ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, f := range fields {
		fmt.Fprintf(m, "%d:%s,", len(f), f)
	}
	return m.Sum(nil)
}

// BodyDigest is the hex SHA-256 of body, as MAC signs it.
func BodyDigest(body []byte) string {
	d := sha256.Sum256(body)
	return hex.EncodeToString(d[:])
}

// Signer signs the calls a node sends with a nonce.
type Signer struct {
	// Name is the signing node's, Key the purpose's key; Now is the
	// node's clock (internal/clock's Now: internal packages stay leaves).
	Name string
	Key  []byte
	Now  func() time.Time
}

// Sign marks out, which carries body, as sent by s for caller; the
// caller's own Authorization is removed.
func (s *Signer) Sign(out *http.Request, caller string, body []byte) {
	var n [16]byte
	_, _ = rand.Read(n[:])
	nonce := hex.EncodeToString(n[:])
	unix := s.Now().Unix()
	mac := MAC(s.Key, out.Method, out.URL.RequestURI(), s.Name, caller, BodyDigest(body), strconv.FormatInt(unix, 10), nonce)
	out.Header.Del("Authorization")
	out.Header.Set(ForwardedHeader, s.Name)
	out.Header.Set(CallerHeader, caller)
	out.Header.Set(NonceHeader, nonce)
	out.Header.Set(Header, strconv.FormatInt(unix, 10)+"."+hex.EncodeToString(mac))
}

// ErrReplayed is a call whose nonce was seen before within the window.
var ErrReplayed = errors.New("hop: this signed call was already received (a replay)")

// ErrGuardFull is a call refused because the replay guard holds as many
// nonces as it may: refusing is safe, accepting unchecked would not be.
var ErrGuardFull = errors.New("hop: too many signed calls within the window to check for replays")

// Verifier checks calls signed by Signer and remembers their nonces for as
// long as their signatures are good, refusing any seen again.
type Verifier struct {
	Key []byte
	Now func() time.Time
	// MaxNonces bounds the nonces remembered (0: 1<<21, about 100 MB at
	// worst, 17,000 calls a second for the two minutes a signature is
	// good).
	MaxNonces int

	mu sync.Mutex
	// seen holds each nonce until the end of its signature's window,
	// bucketed by the minute it lapses in, so forgetting is a map drop.
	seen  map[int64]map[[16]byte]struct{}
	count int
}

// Verify checks r, whose body is body, and returns the node that signed it
// and the caller it vouches for. The error says what is wrong.
func (v *Verifier) Verify(r *http.Request, body []byte) (from, caller string, err error) {
	from, caller = r.Header.Get(ForwardedHeader), r.Header.Get(CallerHeader)
	ts, sig, ok := strings.Cut(r.Header.Get(Header), ".")
	unix, perr := strconv.ParseInt(ts, 10, 64)
	got, herr := hex.DecodeString(sig)
	nonceText := r.Header.Get(NonceHeader)
	var nonce [16]byte
	nerr := errors.New("no nonce")
	if len(nonceText) == 32 {
		_, nerr = hex.Decode(nonce[:], []byte(nonceText))
	}
	if !ok || perr != nil || herr != nil || nerr != nil || len(v.Key) == 0 {
		return from, caller, fmt.Errorf("a call forwarded by %q carries no valid %s and %s headers", from, Header, NonceHeader)
	}
	now := v.Now()
	signed := time.Unix(unix, 0)
	if d := now.Sub(signed); d > Window || d < -Window {
		return from, caller, fmt.Errorf("a call forwarded by %q was signed %s away from this node's clock, more than %s: are the two nodes' clocks set?", from, d.Round(time.Second), Window)
	}
	want := MAC(v.Key, r.Method, r.RequestURI, from, caller, BodyDigest(body), ts, nonceText)
	if !hmac.Equal(got, want) {
		return from, caller, fmt.Errorf("a call forwarded by %q has a wrong signature: do all nodes have the same cluster token?", from)
	}
	return from, caller, v.remember(nonce, signed.Add(Window), now)
}

// remember records nonce until lapse, forgetting what lapsed before now.
func (v *Verifier) remember(nonce [16]byte, lapse, now time.Time) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.seen == nil {
		v.seen = map[int64]map[[16]byte]struct{}{}
	}
	minute := now.Unix() / 60
	for b, m := range v.seen {
		// A bucket holds the nonces lapsing in minute b: once the whole
		// minute is past, every signature in it is refused by its time.
		if b < minute {
			v.count -= len(m)
			delete(v.seen, b)
		}
	}
	for _, m := range v.seen {
		if _, dup := m[nonce]; dup {
			return ErrReplayed
		}
	}
	if v.count >= v.maxNonces() {
		return ErrGuardFull
	}
	b := lapse.Unix() / 60
	if v.seen[b] == nil {
		v.seen[b] = map[[16]byte]struct{}{}
	}
	v.seen[b][nonce] = struct{}{}
	v.count++
	return nil
}

func (v *Verifier) maxNonces() int {
	if v.MaxNonces > 0 {
		return v.MaxNonces
	}
	return 1 << 21
}
