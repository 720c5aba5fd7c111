// Package secret derives llmgw's secondary secrets from the cluster token.
//
// Every secret llmgw derives from the cluster token goes through Derive,
// each with a purpose label of its own, so that no two uses share a value
// and knowing one derived secret (an engine's API key, say, which an engine
// sees) tells nothing about the token or about another one. A new use gets
// a new label; a label is never given a second meaning.
package secret

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// Derive is HMAC-SHA256 keyed by the token over label. The label names the
// purpose (and, where it has one, the object: an engine ID); it is the
// only thing that separates one derived secret from another.
func Derive(token, label string) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(label))
	return m.Sum(nil)
}

// engineKeyLabel is the purpose label of engine API keys. The NUL keeps
// the label and the engine ID apart: no engine ID can make the label of
// another purpose.
const engineKeyLabel = "llmgw engine api key\x00"

// EngineKey is the API key engine engineID is started with (vLLM's and
// SGLang's --api-key, llama.cpp's, the fake engine's): the first 32 hex
// characters (128 bits) of Derive(token, "llmgw engine api key\x00" +
// engineID). Every node derives the same key for an engine from the token
// alone, so whatever routes to an engine (a gateway on any node, the
// scenario runner) can present it without the key ever travelling, and an
// engine's port reached without it answers 401. Keys differ per engine ID,
// so a route gone stale to a port another engine now holds is refused
// rather than answered by the wrong model.
//
// An empty token gives an empty key (no key: the engine runs open), since
// a key derived from no secret would be one anybody can compute.
func EngineKey(token, engineID string) string {
	if token == "" {
		return ""
	}
	return hex.EncodeToString(Derive(token, engineKeyLabel+engineID))[:32]
}

// Fingerprint identifies a cluster token without revealing it: the first
// 16 hex characters of Derive(token, "llmgw token fingerprint v1"). Nodes
// announce it in gossip so that two nodes with different tokens see it
// (each refuses the other's API calls). The label is versioned: a new
// derivation gets a new label, never the same one reused. Empty without a
// token, so nothing is compared.
func Fingerprint(token string) string {
	if token == "" {
		return ""
	}
	return hex.EncodeToString(Derive(token, "llmgw token fingerprint v1"))[:16]
}

// HopKey is the key that signs one kind of node-to-node call (purpose:
// "logs", "mcp", "weights", "relay"), so a signature made for one kind of hop is no good for
// another, and none reveals the token.
func HopKey(token, purpose string) []byte {
	return Derive(token, "llmgw node-to-node\x00"+purpose)
}
