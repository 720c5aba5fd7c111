package fakeengine

import (
	"encoding/binary"
	"hash/fnv"
	"strings"
	"time"
)

// charsPerToken is the fake tokenizer: about four characters of English per
// token, the usual rule of thumb for BPE tokenizers. Every count the fake
// reports (usage, /metrics, the prefill time, the prefix cache) comes from
// it, so they agree with each other.
const charsPerToken = 4

// prompt is one request's input as the engine model sees it: its bytes, cut
// into tokens of perToken bytes each.
type prompt struct {
	// kind keeps text and token ids apart in the block hashes: the same
	// bytes mean different tokens.
	kind     byte
	data     []byte
	perToken int
}

func textPrompt(s string) prompt { return prompt{kind: 't', data: []byte(s), perToken: charsPerToken} }

// idsPrompt is a pre-tokenised prompt: one token per id.
func idsPrompt(ids []int) prompt {
	b := make([]byte, 4*len(ids))
	for i, id := range ids {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(id))
	}
	return prompt{kind: 'i', data: b, perToken: 4}
}

// chatPrompt is the chat messages' roles and contents in order, as a chat
// template lays them out, so two conversations that share their system
// prompt share a prefix.
func chatPrompt(roles, contents []string) prompt {
	var b strings.Builder
	for i := range roles {
		b.WriteString(roles[i])
		b.WriteByte('\n')
		b.WriteString(contents[i])
		b.WriteByte('\n')
	}
	return textPrompt(b.String())
}

// tokens is the prompt's length in tokens; an empty prompt still costs one
// (BOS).
func (p prompt) tokens() int { return max(1, (len(p.data)+p.perToken-1)/p.perToken) }

// textTokens counts the tokens of a text, as a prompt of its own.
func textTokens(s string) int { return textPrompt(s).tokens() }

// blockHashes hashes the prompt's full blocks of blockSize tokens, each
// hash chained on its parent's as vLLM's prefix cache does: block i's hash
// stands for the whole prefix up to it, so equal hashes mean equal
// prefixes. The last, partial block is not hashed (vLLM caches only full
// blocks).
func (p prompt) blockHashes(blockSize int) []uint64 {
	size := blockSize * p.perToken
	n := len(p.data) / size
	out := make([]uint64, n)
	var parent [8]byte
	parent[0] = p.kind
	for i := range n {
		h := fnv.New64a()
		_, _ = h.Write(parent[:])
		_, _ = h.Write(p.data[i*size : (i+1)*size])
		out[i] = h.Sum64()
		binary.LittleEndian.PutUint64(parent[:], out[i])
	}
	return out
}

// prefillTime is the time to first token for a prompt of which uncached
// tokens must be computed.
func (s *Server) prefillTime(uncached int) time.Duration {
	return s.cfg.PrefillBase + time.Duration(int64(s.cfg.PrefillPer1KTokens)*int64(uncached)/1000)
}
