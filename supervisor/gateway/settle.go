package gateway

import "time"

// route resolves a request's model against the table in use. While the
// node has not settled (Table.Settled: it has not heard the cluster yet,
// as after a restart), a model the table does not know, or knows without
// a live route, may simply not have reached this node: the request is held
// until a table routes it or a settled one answers for it, at most
// Config.SettleHold, and then answered 503 with Retry-After rather than
// 404, which a client takes for a model that does not exist. A held
// request counts as in flight (admission, drain); one still held when
// the gateway drains is answered 503 at once. A route a table already
// has is taken at once, settled or not: the engine is ready, and waiting
// would only add latency.
func (x *exchange) route(model string) (*routing, *Entry, bool, *apiError) {
	g := x.g
	var hold <-chan time.Time
	for {
		rt := g.routing.Load()
		e, byID, err := rt.table.resolve(model)
		if rt.table.settled || (err == nil && hasCandidate(rt.routes[e.Name], nil, g.clock.Now())) {
			return rt, e, byID, err
		}
		if hold == nil {
			t := g.clock.NewTimer(g.cfg.SettleHold)
			defer t.Stop()
			hold = t.Chan()
		}
		select {
		case <-rt.replaced:
		case <-hold:
			return nil, nil, false, errSettling()
		case <-g.draining:
			return nil, nil, false, errStopping()
		case <-x.r.Context().Done():
			x.clientGone()
			return nil, nil, false, errSettling()
		}
	}
}
