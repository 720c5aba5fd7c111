package supervisor

import (
	"encoding/hex"

	"github.com/llmgw/llmgw/internal/secret"
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
	return hex.EncodeToString(secret.Derive(token, "llmgw token fingerprint v1"))[:16]
}
