package gateway

import "net/http"

// outcome is how an attempt went, as try and the relay record it on the
// way: all done needs to close the attempt's books.
type outcome struct {
	// status is the engine's answer, when one came.
	status int
	// movedOn: the answer was left for another replica, not relayed.
	movedOn bool
	// broke is why the attempt ended before its answer did, as the
	// metrics label it: connect, first_byte_timeout, stream_idle_timeout,
	// left_routing or stream; empty when it did not.
	broke string
	// note is the access log's error for a break after the answer's
	// status went out.
	note string
}

// answerReason is what an answer says of the replica, as the upstream
// errors' kind labels it; empty for an answer that says nothing (2xx, 4xx
// but 401, 403 and 429).
func answerReason(status int) string {
	switch {
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return reasonAuth
	case status == http.StatusTooManyRequests, status == http.StatusServiceUnavailable:
		return reasonBusy
	case failingStatus(status):
		return statusReason(status)
	}
	return ""
}

// failingStatus reports whether an engine's answer counts toward ejecting
// it: 500, 502 and 504 (see exchange.forward).
func failingStatus(status int) bool {
	return status == http.StatusInternalServerError || status == http.StatusBadGateway || status == http.StatusGatewayTimeout
}

// failure is what of the outcome counts toward ejecting the replica, if
// anything: a 5xx answer, else a connection that failed or an answer with
// no byte within the first-byte bound. An attempt counts once at most.
func (o outcome) failure() string {
	if failingStatus(o.status) {
		return statusReason(o.status)
	}
	if o.broke == reasonConnect || o.broke == reasonFirstByte {
		return o.broke
	}
	return ""
}

// done closes an attempt's books, whichever way it ended (try defers it,
// so a panic closes them too), from its outcome:
//
//   - the attempt itself: its timer, its tracking, its context;
//   - its count in the replica's load: an answer that went to the client
//     was served, and its duration feeds the scrape interval;
//   - the upstream errors, by what the answer said and how it broke;
//   - the replica's health: a refused engine key ejects it at once, a
//     failure counts toward ejecting it, and a busy answer left for
//     another replica proves it up (a relayed answer proves it with its
//     first byte: attempt.progress);
//   - the access log's replica, node, attempts, and the error of a break.
//
// It judges at the time it runs, when the outcome is known: an ejection
// runs EjectFor from the failure, not from the request's sending, which
// for a first-byte timeout is minutes earlier.
func (x *exchange) done(a *attempt, out outcome) {
	g := x.g
	lr, now := a.lr, g.clock.Now()
	a.endAttemptSpan(out)
	if a.timer != nil {
		a.timer.Stop()
	}
	lr.rep.untrack(a.id)
	a.cancel(nil)
	if a.committed {
		lr.rep.load.finish(a.ticket, now)
	} else {
		lr.rep.load.end(a.ticket)
	}
	// The replica has room for one more: a request waiting for it goes.
	g.kick(lr.Deployment)
	answer := answerReason(out.status)
	for _, kind := range [...]string{answer, out.broke} {
		if kind != "" {
			g.m.upstreamErrors.WithLabelValues(lr.Deployment, lr.ReplicaID, kind).Inc()
		}
	}
	switch {
	case answer == reasonAuth:
		lr.rep.health.eject(now, g.cfg.EjectFor)
		g.m.ejections.WithLabelValues(lr.Deployment, lr.ReplicaID, reasonAuth).Inc()
	case answer == reasonBusy && out.movedOn:
		lr.rep.health.answered()
	default:
		// A failure counts toward ejecting the replica; the one that
		// tips it over is counted as the ejection's reason.
		if reason := out.failure(); reason != "" && lr.rep.health.failed(now, g.cfg.EjectAfter, g.cfg.EjectFor) {
			g.m.ejections.WithLabelValues(lr.Deployment, lr.ReplicaID, reason).Inc()
		}
	}
	x.entry.replica, x.entry.node, x.entry.attempts = lr.ReplicaID, lr.Node, a.n+1
	// A client that went away while its error event was written is
	// logged as gone.
	if out.note != "" && !x.gone {
		x.entry.err = out.note
	}
}
