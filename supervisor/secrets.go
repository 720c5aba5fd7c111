package supervisor

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// fingerprint identifies a cluster token without revealing it: the first
// 16 hex characters of HMAC-SHA256 keyed by the token over a fixed label.
// Nodes announce it in gossip so that two nodes with different tokens see
// it (each refuses the other's API calls). The label is versioned: a new
// derivation gets a new label, never the same one reused. Empty without a
// token, so nothing is compared.
func fingerprint(token string) string {
	if token == "" {
		return ""
	}
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("llmgw token fingerprint v1"))
	return hex.EncodeToString(m.Sum(nil))[:16]
}
