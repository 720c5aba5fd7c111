package supervisor

import (
	"crypto/hmac"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/hop"
	"github.com/llmgw/llmgw/internal/secret"
)

// Node-to-node calls never carry the cluster token: they go to an address
// learned from gossip, which anyone who can reach an unencrypted gossip
// port can forge (records are not signed). A node that has checked its
// caller's token signs the hop instead, with a secret derived from the
// token for that one purpose; the receiving node, holding the same token,
// checks the signature. The token itself never leaves the node, and a
// signature is good for one method, path and query, one body, one
// forwarding node, one caller, and hopWindow either side of its time.
//
// The logs proxy (purpose "logs"), MCP forwarding ("mcp") and the lookup of
// a model's headers for gpu_memory: auto ("weights") use it. The gateway's
// relay to another node's engine ("relay") signs with internal/hop's
// Signer, which adds a nonce: an inference request must not run twice.
const (
	hopHeader       = hop.Header
	hopCallerHeader = hop.CallerHeader
	// forwardedHeader names the forwarding node; a forwarded request is
	// served where it arrives, never forwarded again.
	forwardedHeader = hop.ForwardedHeader
	hopWindow       = hop.Window
)

// hopMAC signs everything the hop's meaning depends on, the body by its
// digest (hop.MAC writes each field with its length).
func hopMAC(key []byte, method, target, from, caller string, body []byte, unix int64) []byte {
	return hop.MAC(key, method, target, from, caller, hop.BodyDigest(body), strconv.FormatInt(unix, 10))
}

// hops signs the calls this node forwards and checks the ones forwarded
// to it. The zero token signs nothing valid: a node without a token
// refuses every hop.
type hops struct {
	name, token string
	clock       clock.Clock
}

// sign marks out, which this node is about to send to another node for
// caller with body, as checked here, in place of the caller's token
// (removed).
func (h *hops) sign(out *http.Request, purpose, caller string, body []byte) {
	out.Header.Del("Authorization")
	unix := h.clock.Now().Unix()
	mac := hopMAC(secret.HopKey(h.token, purpose), out.Method, out.URL.RequestURI(), h.name, caller, body, unix)
	out.Header.Set(forwardedHeader, h.name)
	out.Header.Set(hopCallerHeader, caller)
	out.Header.Set(hopHeader, strconv.FormatInt(unix, 10)+"."+hex.EncodeToString(mac))
}

// verify checks the signature of a request another node forwarded, whose
// body is body, and returns the caller it vouches for. The error says what
// is wrong.
func (h *hops) verify(r *http.Request, purpose string, body []byte) (string, error) {
	from, caller := r.Header.Get(forwardedHeader), r.Header.Get(hopCallerHeader)
	ts, sig, ok := strings.Cut(r.Header.Get(hopHeader), ".")
	unix, err := strconv.ParseInt(ts, 10, 64)
	got, herr := hex.DecodeString(sig)
	if !ok || err != nil || herr != nil || h.token == "" {
		return "", fmt.Errorf("a call forwarded by %q carries no valid %s header", from, hopHeader)
	}
	if d := h.clock.Now().Sub(time.Unix(unix, 0)); d > hopWindow || d < -hopWindow {
		return "", fmt.Errorf("a call forwarded by %q was signed %s away from this node's clock, more than %s: are the two nodes' clocks set?", from, d.Round(time.Second), hopWindow)
	}
	if !hmac.Equal(got, hopMAC(secret.HopKey(h.token, purpose), r.Method, r.RequestURI, from, caller, body, unix)) {
		return "", fmt.Errorf("a call forwarded by %q has a wrong signature: do all nodes have the same cluster token?", from)
	}
	return caller, nil
}

// SignHop signs out, a request with body that this node forwards to
// another node for MCP (see hops.sign), in place of the caller's token.
func (n *Node) SignHop(out *http.Request, caller string, body []byte) {
	n.hops.sign(out, "mcp", caller, body)
}

// RequireTokenOrHop wraps h so that it needs the cluster token, or a hop
// signed for MCP by another node holding the same token (MCP forwarding
// never sends the token); see apiServer.requireTokenOrHop.
func (n *Node) RequireTokenOrHop(h http.Handler) http.Handler { return n.api.requireTokenOrHop(h) }
