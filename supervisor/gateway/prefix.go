package gateway

import (
	"bytes"
	"encoding/json"
	"hash"
	"hash/fnv"
)

// prefixKey hashes the start of a request's prompt in a canonical byte
// form, so that requests which share a prefix, however their JSON was
// spaced or escaped, share a key:
//
//   - chat: each message's role and content, in order. The last message is
//     left out when there are several: it is the new turn, which no engine
//     has cached yet, and leaving it out keeps every turn of a
//     conversation, and every question after a tenant's system prompt, on
//     the key of what came before.
//   - completions: the prompt.
//
// Only the first maxBytes of that form count. Embeddings have no key, and
// neither has a prefix shorter than minPrefixBytes: an engine caches whole
// blocks of tokens (16 in vLLM), so a few dozen characters in common save it
// next to nothing, while pinning them to one replica costs balance (a
// workload of short unique questions would queue on hash collisions that
// least-load avoids).
func prefixKey(body []byte, ep endpoint, maxBytes int) (uint64, bool) {
	if ep == embeddingsEndpoint || maxBytes <= 0 {
		return 0, false
	}
	var field span
	want := ep.required()
	if err := scanObject(body, func(key []byte, v span) {
		if string(key) == want {
			field = v
		}
	}); err != nil || !field.ok() {
		return 0, false
	}
	h := &cappedHash{h: fnv.New64a(), left: maxBytes}
	raw := body[field.start:field.end]
	if ep == completionsEndpoint {
		writeText(h, raw)
	} else {
		msgs := arrayElems(raw)
		if len(msgs) > 1 {
			msgs = msgs[:len(msgs)-1]
		}
		for _, m := range msgs {
			if h.left <= 0 {
				break
			}
			writeMessage(h, raw[m.start:m.end])
		}
	}
	if h.n < min(minPrefixBytes, maxBytes) {
		return 0, false
	}
	return h.h.Sum64(), true
}

// minPrefixBytes is the shortest prefix worth affinity: about 64 tokens, four
// of vLLM's blocks.
const minPrefixBytes = 256

// cappedHash hashes at most left bytes.
type cappedHash struct {
	h    hash.Hash64
	left int
	n    int
}

func (c *cappedHash) write(b []byte) {
	if c.left <= 0 {
		return
	}
	if len(b) > c.left {
		b = b[:c.left]
	}
	_, _ = c.h.Write(b)
	c.left -= len(b)
	c.n += len(b)
}

// Separators between the parts of a message, bytes no JSON text contains
// unescaped.
var (
	partSep    = []byte{0x1f}
	messageSep = []byte{0x1e}
)

func writeMessage(h *cappedHash, msg []byte) {
	var role, content span
	if scanObject(msg, func(key []byte, v span) {
		switch string(key) {
		case "role":
			role = v
		case "content":
			content = v
		}
	}) != nil {
		return
	}
	if role.ok() {
		writeText(h, msg[role.start:role.end])
	}
	h.write(partSep)
	if content.ok() {
		writeText(h, msg[content.start:content.end])
	}
	h.write(messageSep)
}

// writeText hashes a JSON string's text, or any other value's JSON as it
// came (a list of content parts, token ids).
func writeText(h *cappedHash, raw []byte) {
	if len(raw) < 2 || raw[0] != '"' {
		h.write(raw)
		return
	}
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		h.write(inner)
		return
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		h.write(raw)
		return
	}
	h.write([]byte(s))
}

// rendezvous is the score of a replica for a key (highest random weight):
// each replica's score for a key is independent of the others, so the
// ranking of the replicas that remain is unchanged when one leaves.
func rendezvous(key uint64, replica string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(replica))
	return mix64(key ^ h.Sum64())
}

// mix64 is the finaliser of SplitMix64: FNV's low bits alone would rank
// replicas with similar names alike.
func mix64(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	return z ^ (z >> 31)
}
