package gateway

import "sync/atomic"

// Policy chooses the replica of one request among candidates the gateway
// already filtered: every one routable, not yet tried for this request,
// and in the best health tier present (not ejected, not on a suspect node,
// when there are such). A policy only ranks; retries, ejection and panic
// mode stay with the gateway, so policies can be compared on equal terms.
//
// Choose is called concurrently and must not block.
type Policy interface {
	// Choose returns the index in cands of the replica to use; cands is
	// never empty.
	Choose(req *Request, cands []Candidate) int
}

// Request is what a policy may read of the request being routed.
type Request struct {
	// Deployment is the deployment the request resolved to.
	Deployment string
	// Body is the request body as it will be sent (read only): what a
	// prefix-affinity policy hashes.
	Body []byte
}

// Candidate is one replica with its load as the gateway estimates it.
type Candidate struct {
	Route *Route
	// Load is the engine's running plus waiting requests: the gateway's
	// last scrape of its /metrics (or the gossiped reading when there is
	// no fresh one), plus this gateway's own requests to it since that
	// scrape, which the engine had not counted yet.
	Load float64
}

// LeastLoad picks the candidate with the lowest load. Ties are broken by a
// rotating start, so equally idle replicas share sequential traffic instead
// of the first one taking all of it.
type LeastLoad struct {
	next atomic.Uint64
}

var _ Policy = (*LeastLoad)(nil)

// Choose implements Policy.
func (p *LeastLoad) Choose(_ *Request, cands []Candidate) int {
	n := len(cands)
	start := int(p.next.Add(1) % uint64(n))
	best := start
	for i := 1; i < n; i++ {
		j := (start + i) % n
		if cands[j].Load < cands[best].Load {
			best = j
		}
	}
	return best
}
