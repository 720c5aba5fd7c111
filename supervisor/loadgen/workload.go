package loadgen

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
)

// words are the filler of the built-in workloads' prompts.
var words = strings.Fields(`the a of to and in is that for it on with as was at by be this from or
have an they which one you had word but not what all were when we there can said use each
she do how their if will up other about out many then them these so some her would make
like him into time has look two more write go see number no way could people my than first
water been call who oil its now find long down day did get come made may part model cluster
engine replica prefix cache token route`)

// text is n characters (n/4 tokens to the fake engine) of filler drawn
// from rng.
func text(rng *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()[:n]
}

// question is request i's short user question, unique to it.
func question(seed uint64, i int) string {
	rng := rand.New(rand.NewPCG(seed, uint64(i)+1))
	// Its own words first, so no two questions share a block.
	return fmt.Sprintf("%s? (question %d)", text(rng, 32), i)
}

// SharedPrefix is the workload that rewards prefix affinity: tenants
// tenants, each with its own system prompt of systemTokens tokens (four
// characters each, as the fake engine counts), and every request one short
// question of its own. Each request's tenant is drawn at random, so the
// tenants arrive interleaved in no fixed cycle (a cycle would line up with
// a round-robin over a divisor of its length and hand that policy affinity
// by accident). Prompts and tenants are a function of seed alone.
func SharedPrefix(tenants, systemTokens int, seed uint64) (Workload, error) {
	if tenants < 1 {
		return nil, errors.New("loadgen: the shared-prefix workload needs at least one tenant")
	}
	if systemTokens < 1 {
		return nil, errors.New("loadgen: the shared-prefix workload needs a system prompt of at least one token")
	}
	system := make([]string, tenants)
	for t := range system {
		// The tenant comes first, so tenants differ from the first block.
		head := fmt.Sprintf("You are the assistant of tenant %d. ", t)
		rng := rand.New(rand.NewPCG(seed, ^uint64(t)))
		system[t] = (head + text(rng, max(0, 4*systemTokens-len(head))))[:4*systemTokens]
	}
	return func(i int) []Message {
		t := rand.New(rand.NewPCG(seed^0x74656e616e74, uint64(i))).IntN(tenants)
		return []Message{{Role: "system", Content: system[t]}, {Role: "user", Content: question(seed, i)}}
	}, nil
}

// Unique is a workload of short questions that share no prefix.
func Unique(seed uint64) Workload {
	return func(i int) []Message { return []Message{{Role: "user", Content: question(seed, i)}} }
}

// Lines is a workload of the given prompts, one user message each, taken
// in turn.
func Lines(prompts []string) (Workload, error) {
	if len(prompts) == 0 {
		return nil, errors.New("loadgen: no prompts")
	}
	return func(i int) []Message { return []Message{{Role: "user", Content: prompts[i%len(prompts)]}} }, nil
}
