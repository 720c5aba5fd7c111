package gateway

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
)

// DefaultDrainTimeout bounds a stopping gateway's drain (Server.Shutdown)
// unless the node says otherwise (--gateway-drain-timeout).
const DefaultDrainTimeout = 10 * time.Second

// idleGrace is how long a client connection must have been idle before a
// stopping server closes it. A client that has just read an answer sent
// without "Connection: close" (a stream begun before the stop) may be
// writing its next request on that connection now; closing it then would
// leave the request without an answer. One that stays quiet this long is
// not about to.
const idleGrace = time.Second

// Server serves a Gateway on one listener, and stops it so that no client
// is left with a connection closed under a request it wrote (Shutdown).
// It tracks its connections' states itself: net/http's own Shutdown
// closes every idle connection at once, which is that very race.
type Server struct {
	gw    *Gateway
	http  *http.Server
	clock clock.Clock

	mu    sync.Mutex
	conns map[net.Conn]connState
	ln    net.Listener
	// closed: the listener is closed, or is to be as soon as Serve gets
	// it.
	closed bool
	// changed is poked at every change of a connection's state.
	changed chan struct{}
}

// connState is one client connection's state and since when it has been
// in it, on the gateway's clock.
type connState struct {
	state http.ConnState
	since time.Time
}

// NewServer returns the server of gw, serving h: gw itself, or gw wrapped
// by the node (nil is gw).
func NewServer(gw *Gateway, h http.Handler) *Server {
	if h == nil {
		h = gw
	}
	s := &Server{gw: gw, clock: gw.clock, conns: map[net.Conn]connState{}, changed: make(chan struct{}, 1)}
	s.http = newHTTPServer(h, s.track)
	return s
}

// newHTTPServer is the gateway's http.Server. Headers must arrive within
// 10 s and idle keep-alive connections close after 2 min. There is no read
// or write timeout: either would end a long stream that is still producing
// (net/http cancels a request's context when the connection's read
// deadline passes); the gateway bounds the body read itself
// (Config.BodyTimeout).
func newHTTPServer(h http.Handler, connState func(net.Conn, http.ConnState)) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ConnState:         connState,
	}
}

// Serve serves on ln until Shutdown; it then returns http.ErrServerClosed.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ln.Close()
		return http.ErrServerClosed
	}
	s.ln = ln
	s.mu.Unlock()
	err := s.http.Serve(ln)
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		// Shutdown closed the listener itself, before net/http knew.
		return http.ErrServerClosed
	}
	return err
}

// track follows each connection's state (http.Server.ConnState).
func (s *Server) track(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	switch st {
	case http.StateClosed, http.StateHijacked:
		delete(s.conns, c)
	default:
		s.conns[c] = connState{state: st, since: s.clock.Now()}
	}
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// open is how many client connections are open.
func (s *Server) open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Shutdown stops the gateway within drain, on the gateway's clock, so that
// no client is left with a connection closed under a request it wrote:
//
//  1. The gateway drains (Gateway.Drain): /health answers 503, and every
//     answer carries "Connection: close", so a connection that carries a
//     request ends after its answer, closed by the server with the
//     client's knowledge. Requests in flight go on; new ones, on open
//     connections or new ones, are served.
//  2. The listener stays open for half the drain, or until no client
//     connection is open, whichever comes first: a load balancer polling
//     /health meanwhile reads 503 and takes the node out while its
//     requests are still served, and clients with connections open use
//     them once more and get "Connection: close". With no connection open
//     nobody is mid-conversation: a client that comes later finds the
//     port closed (refused, which every client retries elsewhere).
//  3. The listener closes. A connection idle for idleGrace is closed; one
//     that went idle more recently (a stream begun before the stop, whose
//     headers could not say "close") gets that long for the client's next
//     request, which is answered with "Connection: close". Busy
//     connections end after their answer.
//  4. At the drain's end, requests still in flight are cut with an answer
//     (503 with Retry-After, or a stream's final error event), and the
//     server closes what is left.
//
// What this cannot rule out is HTTP/1.1's own race: a client that writes
// a request on a connection idle for idleGrace at the very moment the
// server closes it, or whose connection waits in the kernel's accept
// queue when the listener closes, sees it closed without an answer. Both
// need a client silent for the grace, or arriving in the instant of the
// close, and both are safe for a client to retry.
//
// It returns an error when requests were still in flight at the drain's
// end.
func (s *Server) Shutdown(drain time.Duration) error {
	if drain <= 0 {
		drain = DefaultDrainTimeout
	}
	s.gw.Drain()
	deadline := s.clock.NewTimer(drain)
	defer deadline.Stop()
	linger := s.clock.NewTimer(drain / 2)
	defer linger.Stop()
	// Only the linger here: it fires before the deadline, and the
	// deadline's one tick must reach closeIdle, or that would wait on
	// connections with no bound.
	for ended := false; !ended && s.open() > 0; {
		select {
		case <-s.changed:
		case <-linger.Chan():
			ended = true
		}
	}
	s.closeListener()
	var err error
	if !s.closeIdle(deadline.Chan()) {
		err = errors.New("gateway: connections still open at the drain's end")
		if n := s.gw.active.Load(); n > 0 {
			err = errors.New("gateway: requests still in flight at the drain's end; cut with an answer")
			s.gw.cutInFlight()
			s.awaitRequests(cutGrace)
		}
	}
	// Whatever is left: connections whose requests just ended, idle ones
	// and a Serve not yet returned.
	_ = s.http.Close()
	s.gw.stopBackground()
	return err
}

// cutGrace bounds the wait for requests cut at the drain's end to write
// their answers.
const cutGrace = time.Second

// closeListener stops accepting: clients that connect from now on are
// refused.
func (s *Server) closeListener() {
	s.mu.Lock()
	s.closed = true
	ln := s.ln
	s.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
}

// closeIdle closes each connection once it has been idle (or new, with no
// request yet) for idleGrace, until none is left, or end fires; it
// reports whether none is left.
func (s *Server) closeIdle(end <-chan time.Time) bool {
	for {
		s.mu.Lock()
		now := s.clock.Now()
		next := time.Duration(-1)
		for c, cs := range s.conns {
			if cs.state != http.StateIdle && cs.state != http.StateNew {
				continue
			}
			if left := idleGrace - now.Sub(cs.since); left > 0 {
				if next < 0 || left < next {
					next = left
				}
				continue
			}
			_ = c.Close()
			delete(s.conns, c)
		}
		n := len(s.conns)
		s.mu.Unlock()
		if n == 0 {
			return true
		}
		if !s.waitChange(next, end) {
			return false
		}
	}
}

// waitChange waits for a connection's state to change, or next to pass
// (none when negative); it reports false when end fires first.
func (s *Server) waitChange(next time.Duration, end <-chan time.Time) bool {
	var wake <-chan time.Time
	if next >= 0 {
		t := s.clock.NewTimer(next)
		defer t.Stop()
		wake = t.Chan()
	}
	select {
	case <-s.changed:
	case <-wake:
	case <-end:
		return false
	}
	return true
}

// awaitRequests waits until the gateway has no request in flight, at most
// d.
func (s *Server) awaitRequests(d time.Duration) {
	t := s.clock.NewTimer(d)
	defer t.Stop()
	for s.gw.active.Load() > 0 {
		select {
		case <-s.gw.idle:
		case <-t.Chan():
			return
		}
	}
}

// NewTransport returns the transport the gateway reaches engines with: many
// concurrent streams to a few upstreams, so many idle connections are kept
// per host (a stream holds its connection for minutes, and re-dialling
// for every request adds a round trip). Dialling is bounded, since a dead
// engine host must fail fast enough to retry elsewhere; waiting for
// response headers is not, since a long prompt's prefill comes before
// them. No proxy from the environment: engines are on the cluster's own
// network. Compression is left to the client and the engine, so the
// gateway never decompresses what it passes on.
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy: nil,
		DialContext: (&net.Dialer{
			Timeout:   2 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ReadBufferSize:      32 << 10,
		WriteBufferSize:     32 << 10,
	}
}
