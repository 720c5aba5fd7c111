package secret

import (
	"encoding/hex"
	"strings"
	"testing"
)

// The derivations are pinned: nodes of different versions, and gateways on
// other nodes, must derive the same keys. The expected values were computed
// independently of this package, with Python's hmac module:
//
//	hmac.new(token.encode(), label.encode(), hashlib.sha256).hexdigest()
func TestDeriveIsPinned(t *testing.T) {
	for _, tc := range []struct{ token, label, want string }{
		{"k", "label", "6b50940f4e3fbdbc0a899bf20885733419412515092535b0c717e92e05a00d14"},
		// The token fingerprint nodes announce (supervisor.fingerprint) is
		// this derivation under its own label, cut to 16 hex characters.
		{"test-token-0123456789abcdef", "llmgw token fingerprint v1", "6ce7a1e2ac612cb480d5e62b8511f4560f0e61f989e8898d68487e8c77ce891c"},
	} {
		if got := hex.EncodeToString(Derive(tc.token, tc.label)); got != tc.want {
			t.Errorf("Derive(%q, %q) = %s, want %s", tc.token, tc.label, got, tc.want)
		}
	}
}

func TestEngineKeyIsPinnedAndPerEngine(t *testing.T) {
	const tok = "test-token-0123456789abcdef"
	for _, tc := range []struct{ token, engine, want string }{
		{tok, "chat-0-0123456789ab", "666afc9123575f78bd71585d2dbc08c4"},
		{tok, "chat-1-0123456789ab", "da605285159028d20af886824df89432"},
		{"other-token-0123456789abcdef", "chat-0-0123456789ab", "a68a674575b9bfa5691eb2bc01702f9a"},
		{"", "chat-0-0123456789ab", ""},
	} {
		if got := EngineKey(tc.token, tc.engine); got != tc.want {
			t.Errorf("EngineKey(%q, %q) = %q, want %q", tc.token, tc.engine, got, tc.want)
		}
	}
}

// The purpose label separates uses: the engine key is not the token's
// fingerprint or any other derivation's prefix.
func TestEngineKeyIsNotAnotherPurposesValue(t *testing.T) {
	const tok = "test-token-0123456789abcdef"
	key := EngineKey(tok, "x")
	if other := hex.EncodeToString(Derive(tok, "x"))[:32]; key == other {
		t.Fatalf("EngineKey equals Derive without the purpose label: %s", key)
	}
	if len(key) != 32 {
		t.Fatalf("EngineKey length %d, want 32", len(key))
	}
}

// The derivation is pinned (the values come from another HMAC
// implementation): nodes of different versions must agree on it.
func TestTokenFingerprintIsPinnedAndRevealsNothing(t *testing.T) {
	for tok, want := range map[string]string{
		"test-token-0123456789abcdef":  "6ce7a1e2ac612cb4",
		"other-token-0123456789abcdef": "df24197abbe92410",
		"":                             "",
	} {
		got := Fingerprint(tok)
		if got != want {
			t.Errorf("Fingerprint(%q) = %q, want %q", tok, got, want)
		}
		if tok != "" && strings.Contains(tok, got) {
			t.Errorf("Fingerprint(%q) = %q is part of the token", tok, got)
		}
	}
}
