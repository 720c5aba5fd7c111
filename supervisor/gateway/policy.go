package gateway

import (
	"fmt"
	"hash/fnv"
	"math"
	"sync/atomic"
)

// Policy chooses the replica of one request among candidates the gateway
// already filtered: every one routable, not yet tried for this request,
// and in the best health tier present (not ejected, not on a suspect node,
// when there are such). A policy only ranks; retries, ejection and panic
// mode stay with the gateway, so policies can be compared on equal terms.
//
// Choose is called concurrently and must not block.
type Policy interface {
	// Choose returns the candidate to use; cands is never empty.
	Choose(req *Request, cands []Candidate) Choice
	// Name is the policy's name in flags and metrics.
	Name() string
}

// Choice is a policy's answer: the index in the candidates and, for the
// prefix policy, how the affinity fared (an Outcome).
type Choice struct {
	Index   int
	Outcome Outcome
}

// Outcome is what became of a request's prefix affinity, counted in
// llmgw_gateway_affinity_total.
type Outcome string

const (
	// NoAffinity: the policy does not use affinity.
	NoAffinity Outcome = ""
	// AffinityTaken: the prefix's first replica in rendezvous order took it.
	AffinityTaken Outcome = "taken"
	// AffinitySpilled: the first replica was over the load bound, a later
	// one in the same order took it.
	AffinitySpilled Outcome = "spilled"
	// AffinityUnkeyed: the request had no prompt to key on (embeddings, an
	// empty prompt); it went to the least loaded.
	AffinityUnkeyed Outcome = "unkeyed"
)

// Request is what a policy may read of the request being routed.
type Request struct {
	// Deployment is the deployment the request resolved to, and Adapter
	// the LoRA adapter of it the request names (empty: none). Cache
	// blocks are per adapter, so the prefix key includes it.
	Deployment string
	Adapter    string
	// Body is the request body as it will be sent (read only).
	Body []byte
	// Others is how many requests the other gateways may be sending to the
	// same replicas, unseen until the next scrape, for each one this
	// gateway sends (Table.Others): one per other gateway when all send
	// alike, zero when this one is the only door in use.
	Others float64

	ep endpoint
	// key caches PrefixKey: the policy may ask on each retry.
	key     uint64
	keyOK   bool
	keyDone bool
}

// PrefixKey is the hash of the request's prompt prefix (see prefixKey),
// false when there is none to key on.
func (r *Request) PrefixKey(maxBytes int) (uint64, bool) {
	if !r.keyDone {
		r.key, r.keyOK = prefixKey(r.Body, r.ep, maxBytes)
		if r.keyOK && r.Adapter != "" {
			h := fnv.New64a()
			h.Write([]byte(r.Adapter))
			r.key ^= h.Sum64() * 0x9e3779b97f4a7c15 // one prompt, another adapter: another key
		}
		r.keyDone = true
	}
	return r.key, r.keyOK
}

// Candidate is one replica with its load as the gateway estimates it.
type Candidate struct {
	Route *Route
	// Load is the engine's running plus waiting requests: the gateway's
	// last scrape of its /metrics (or the gossiped reading when there is
	// no fresh one), plus this gateway's own requests to it since that
	// scrape, which the engine had not counted yet.
	Load float64
	// Own is the part of Load that is this gateway's requests since the
	// scrape: what other gateways may be adding unseen as well.
	Own float64
}

// NewPolicy returns the policy of a name: "prefix" (the default when name
// is empty), "least-load" or "round-robin". prefixBytes and balance
// configure the prefix policy (zero for the defaults).
func NewPolicy(name string, prefixBytes int, balance float64) (Policy, error) {
	switch name {
	case "", "prefix":
		if balance != 0 && balance < 1 {
			return nil, fmt.Errorf("balance %g: want at least 1 (1.25 lets a replica take 25%% over the mean)", balance)
		}
		if prefixBytes < 0 {
			return nil, fmt.Errorf("prefix bytes %d: want a positive count", prefixBytes)
		}
		return &Prefix{Bytes: prefixBytes, Balance: balance}, nil
	case "least-load":
		return &LeastLoad{}, nil
	case "round-robin":
		return &RoundRobin{}, nil
	}
	return nil, fmt.Errorf("%q: want prefix, least-load or round-robin", name)
}

// LeastLoad picks the candidate with the lowest load. Ties are broken by a
// rotating start, so equally idle replicas share sequential traffic instead
// of the first one taking all of it.
//
// Like Prefix, it counts its own unscraped requests once more for every
// request the other gateways send per one of its own (Request.Others):
// every gateway reads the same scrapes, and if each counted only its own
// requests since, all of them would pick the same replica until the next
// scrape, a herd.
type LeastLoad struct {
	next atomic.Uint64
}

var _ Policy = (*LeastLoad)(nil)

// Name implements Policy.
func (p *LeastLoad) Name() string { return "least-load" }

// Choose implements Policy.
func (p *LeastLoad) Choose(req *Request, cands []Candidate) Choice {
	return Choice{Index: p.least(cands, othersOf(req))}
}

func (p *LeastLoad) least(cands []Candidate, extra float64) int {
	n := len(cands)
	start := int(p.next.Add(1) % uint64(n))
	best := start
	for i := 1; i < n; i++ {
		j := (start + i) % n
		if cands[j].Load+extra*cands[j].Own < cands[best].Load+extra*cands[best].Own {
			best = j
		}
	}
	return best
}

// othersOf is the request's Others, 0 when there is none to say.
func othersOf(req *Request) float64 {
	if req == nil || !(req.Others > 0) {
		return 0
	}
	return req.Others
}

// RoundRobin takes the candidates in turn, blind to load and prompt: the
// baseline the other policies are measured against.
type RoundRobin struct {
	next atomic.Uint64
}

var _ Policy = (*RoundRobin)(nil)

// Name implements Policy.
func (p *RoundRobin) Name() string { return "round-robin" }

// Choose implements Policy.
func (p *RoundRobin) Choose(_ *Request, cands []Candidate) Choice {
	return Choice{Index: int((p.next.Add(1) - 1) % uint64(len(cands)))}
}

// Defaults of Prefix.
const (
	DefaultPrefixBytes = 2048
	DefaultBalance     = 1.25
)

// Prefix sends requests that share a prompt prefix to the same replica, so
// the engine's prefix cache serves them, without any state shared between
// gateways: the replicas are ranked by rendezvous hash of (prefix,
// replica), which every gateway with the same view computes alike, and a
// replica that leaves moves only its own prefixes.
//
// Affinity never overloads a replica: the first replica in that order
// whose load is within Balance times the mean takes the request
// (consistent hashing with bounded loads, Mirrokni, Thorup and
// Zadimoghaddam). Loads are the engines' own reports plus this gateway's
// requests since its scrape. Other gateways may be adding to the same
// replica unseen until the next scrape, so this gateway counts its own
// unscraped requests once more for every request the others send per one
// of its own (Request.Others, from the rates every gateway publishes), as
// if they had done as it did: the gateways then share the headroom above a
// replica's reported load instead of each taking all of it, and together
// they exceed the bound by at most about one request per gateway. A door
// that takes all the traffic counts its requests once: nobody else adds.
type Prefix struct {
	// Bytes is how much of the canonical prompt is hashed
	// (DefaultPrefixBytes when zero).
	Bytes int
	// Balance is the bound on a replica's load as a multiple of the mean
	// (DefaultBalance when zero; at least 1).
	Balance float64

	fallback LeastLoad
}

var _ Policy = (*Prefix)(nil)

// Name implements Policy.
func (p *Prefix) Name() string { return "prefix" }

// Choose implements Policy.
func (p *Prefix) Choose(req *Request, cands []Candidate) Choice {
	nbytes := p.Bytes
	if nbytes == 0 {
		nbytes = DefaultPrefixBytes
	}
	key, ok := uint64(0), false
	if req != nil {
		key, ok = req.PrefixKey(nbytes)
	}
	if !ok {
		return Choice{Index: p.fallback.least(cands, othersOf(req)), Outcome: AffinityUnkeyed}
	}
	i, spilled := boundedChoice(key, cands, othersOf(req), p.balance())
	out := AffinityTaken
	if spilled {
		out = AffinitySpilled
	}
	return Choice{Index: i, Outcome: out}
}

func (p *Prefix) balance() float64 {
	if p.Balance < 1 {
		return DefaultBalance
	}
	return p.Balance
}

// affinityFloor is the load under which a replica takes its prefixes'
// requests whatever the mean. An engine runs many sequences at once, so so
// small a load queues nothing; and at loads that small the mean's rounding
// and a scrape a moment old (another gateway's request, finished since)
// would otherwise scatter a tenant over replicas for no gain.
const affinityFloor = 4

// boundedChoice is the bounded-load rule over the rendezvous order of key:
// the first candidate whose load, counting this request, is at most
// ceil(balance x (total + 1) / n), or affinityFloor when that is more,
// takes it; total is the sum of the candidates' loads as reported plus this
// gateway's own since.
//
// A candidate's own requests since its scrape count 1 + extra times when
// it is judged: the other gateways may have sent extra times as many
// unseen. (They count once in total: inflating the total would raise the
// bound for everyone.) When that judgement leaves no one, a burst outran the
// scrapes, and the least loaded as judged takes it. spilled says the first
// in the order did not.
func boundedChoice(key uint64, cands []Candidate, extra, balance float64) (int, bool) {
	total := 0.0
	for _, c := range cands {
		total += c.Load
	}
	bound := max(math.Ceil(balance*(total+1)/float64(len(cands))), affinityFloor)
	first, firstScore := -1, uint64(0)
	best, bestScore := -1, uint64(0)
	least, leastLoad := 0, math.Inf(1)
	for i, c := range cands {
		judged := c.Load + extra*c.Own
		if judged < leastLoad {
			least, leastLoad = i, judged
		}
		s := rendezvous(key, c.Route.key())
		if first < 0 || s > firstScore {
			first, firstScore = i, s
		}
		if judged+1 <= bound && (best < 0 || s > bestScore) {
			best, bestScore = i, s
		}
	}
	if best < 0 {
		best = least
	}
	return best, best != first
}
