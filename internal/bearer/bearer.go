// Package bearer reads and checks "Authorization: Bearer <token>" headers:
// the node's API, MCP and the gateway parse them here, one way, and compare
// secrets in time that says nothing of either.
package bearer

import (
	"crypto/sha256"
	"crypto/subtle"
	"strings"
)

// Token is the credentials of an "Authorization: Bearer <token>" header.
// The scheme is case-insensitive (RFC 9110 section 11.1), so "bearer" and
// "BEARER" are the same scheme; spaces around the token are not part of
// it. ok is false when the header is not a bearer header or has no token.
func Token(header string) (tok string, ok bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// Equal reports whether got is want, in time independent of both: the two
// are hashed first, so neither the position of the first difference nor
// the secret's length shows in the time taken (subtle.ConstantTimeCompare
// returns at once on a length mismatch). An empty want matches nothing: a
// node without a token refuses every caller.
func Equal(got, want string) bool {
	if want == "" {
		return false
	}
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}
