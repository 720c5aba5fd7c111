package placement

// Hashes used for tie-breaking. They are fixed functions of names, the same
// on every node and every architecture; nothing here is seeded by a clock or
// math/rand.

// fnv1a is 64-bit FNV-1a of s.
func fnv1a(s string) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= prime
	}
	return h
}

// mix64 is the splitmix64 finaliser: every input bit affects every output
// bit, which FNV alone does poorly for short, similar names (n1, n2, ...).
func mix64(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	z ^= z >> 31
	return z
}

// nodeKey is a node's half of the rendezvous hash, computed once per node.
func nodeKey(name string) uint64 { return mix64(fnv1a(name)) }

// rendezvous scores the pair (shard, node); among otherwise equal nodes the
// highest score wins. A node joining or leaving changes the winner only for
// shards it wins or won, so ties do not reshuffle when membership changes.
func rendezvous(shardHash, nodeKey uint64) uint64 { return mix64(shardHash ^ nodeKey) }
