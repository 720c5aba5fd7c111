package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/profile"
)

// rawConn is one client connection kept alive across requests, on a real
// socket, so that a test knows which connection each request rides and
// whether the server closed it before or after the request was written.
type rawConn struct {
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{c: c, br: bufio.NewReader(c)}
}

// exchangeResult is one request's answer on a rawConn.
type exchangeResult struct {
	resp *http.Response
	body string
	// err is set when no whole answer came; wrote says the request had
	// been written then (a connection closed under it).
	err   error
	wrote bool
}

// do writes one request and reads its answer whole. The body (a stream
// included) is read to its end.
func (rc *rawConn) do(method, path, body string) exchangeResult {
	if err := rc.send(method, path, body); err != nil {
		return exchangeResult{err: err}
	}
	return rc.read(method)
}

// send writes one request.
func (rc *rawConn) send(method, path, body string) error {
	_, err := fmt.Fprintf(rc.c, "%s %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", method, path, len(body), body)
	return err
}

// read reads one answer whole.
func (rc *rawConn) read(method string) exchangeResult {
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		return exchangeResult{err: err, wrote: true}
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return exchangeResult{resp: resp, body: string(b), err: err, wrote: true}
	}
	return exchangeResult{resp: resp, body: string(b)}
}

// drainHarness is a gateway served by its own Server on a real listener,
// on a fake clock: the drain's phases move only when a client connection
// closes or the test advances the clock. No engine profile: no timer of
// the gateway's own runs on that clock but the drain's.
type drainHarness struct {
	gw    *Gateway
	srv   *Server
	addr  string
	clock *clock.Fake
	// stopped gets Shutdown's result.
	stopped chan error
	served  chan error
}

func newDrainHarness(t *testing.T, upstreamURL string) *drainHarness {
	t.Helper()
	d := &drainHarness{clock: clock.NewFake(t0), stopped: make(chan error, 1), served: make(chan error, 1)}
	d.gw = New(Config{Clock: d.clock, Profiles: map[string]profile.Profile{}})
	w := oneDeployment(upstreamURL)
	w.ttl = time.Hour // the leases outlast the drain's moves of the clock
	d.gw.Update(w.snapshot())
	d.srv = NewServer(d.gw, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d.addr = ln.Addr().String()
	go func() { d.served <- d.srv.Serve(ln) }()
	t.Cleanup(func() {
		// A test that failed midway: end the drain at once.
		select {
		case <-d.stopped:
		default:
			d.clock.Advance(time.Hour)
		}
		if err := <-d.served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
		}
	})
	return d
}

// shutdown starts the drain, and waits until a fresh connection reads
// /health 503 (or is refused: the listener closed).
func (d *drainHarness) shutdown(t *testing.T, drain time.Duration) {
	t.Helper()
	go func() { d.stopped <- d.srv.Shutdown(drain) }()
	testwait.Until(t, 5*time.Second, "the gateway drains", func() (bool, string) {
		c, err := net.Dial("tcp", d.addr)
		if err != nil {
			return true, ""
		}
		rc := &rawConn{c: c, br: bufio.NewReader(c)}
		defer c.Close()
		r := rc.do(http.MethodGet, "/health", "")
		if r.err != nil {
			return false, r.err.Error()
		}
		return r.resp.StatusCode == 503, r.resp.Status
	})
}

// wait is Shutdown's result; it fails the test if the drain does not end
// by itself (the fake clock does not move).
func (d *drainHarness) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-d.stopped:
		d.stopped <- err
		return err
	case <-time.After(10 * time.Second): // a deadline for the test, not a synchronisation
		t.Fatal("Shutdown did not return once every client connection had closed")
		return nil
	}
}

// holdingUpstream answers chats at once, and a stream asked with "slow"
// once release is closed: two events, then [DONE].
func holdingUpstream(t *testing.T, release <-chan struct{}) *upstream {
	return newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(bodyText(r), "slow") {
			chatOK(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		fmt.Fprint(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: {\"n\":2}\n\ndata: [DONE]\n\n")
	})
}

const slowStream = `{"model":"chat","stream":true,"messages":[{"role":"user","content":"slow"}]}`

// startStream sends slowStream on a fresh connection and waits until the
// gateway has it in flight (no other request is); its answer, read
// whole, comes on the channel.
func (d *drainHarness) startStream(t *testing.T) (*rawConn, <-chan exchangeResult) {
	t.Helper()
	rc := dialRaw(t, d.addr)
	if err := rc.send(http.MethodPost, "/v1/chat/completions", slowStream); err != nil {
		t.Fatal(err)
	}
	out := make(chan exchangeResult, 1)
	go func() { out <- rc.read(http.MethodPost) }()
	testwait.Until(t, 5*time.Second, "the stream begun", func() (bool, string) { return d.gw.active.Load() == 1, "" })
	return rc, out
}

// listenerClosed waits until the server refuses new connections.
func (d *drainHarness) listenerClosed(t *testing.T) {
	t.Helper()
	testwait.Until(t, 5*time.Second, "the listener closes", func() (bool, string) {
		c, err := net.Dial("tcp", d.addr)
		if err == nil {
			c.Close()
			return false, "accepts"
		}
		return true, ""
	})
}

// During a stop, every request gets an answer: clients busy on keep-alive
// connections, clients whose connections were idle when the stop began
// and then send, and a stream begun before the stop whose client then
// sends its next request on the same connection. Every one is served
// (200, not 503 "node stopping") with Connection: close, and no
// connection is closed under a request it carried; once none is open the
// listener closes and the drain ends. Today's code refused the requests
// that arrived with 503 and closed the idle connections under the
// clients' next requests.
func TestDrainAnswersEveryRequestOnOpenConnections(t *testing.T) {
	release := make(chan struct{})
	var releaseOnce sync.Once
	u := holdingUpstream(t, release)
	d := newDrainHarness(t, u.URL)
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })

	// The stream, begun before the stop: its headers go out without
	// "close".
	streamer, streamed := d.startStream(t)

	// Idle clients: one answer each before the stop, then quiet.
	idle := make([]*rawConn, 4)
	for i := range idle {
		idle[i] = dialRaw(t, d.addr)
		if r := idle[i].do(http.MethodPost, "/v1/chat/completions", chatBody("chat", false)); r.err != nil || r.resp.StatusCode != 200 || r.resp.Close {
			t.Fatalf("idle client %d before the stop: %+v", i, r)
		}
	}

	// Busy clients: requests back to back until an answer says close.
	const busy = 8
	var failures atomic.Int64
	var failed sync.Map
	var wg sync.WaitGroup
	closedByAnswer := make(chan int, busy)
	started := make(chan struct{}, busy)
	for i := range busy {
		rc := dialRaw(t, d.addr)
		wg.Go(func() {
			for n := 0; ; n++ {
				r := rc.do(http.MethodPost, "/v1/chat/completions", chatBody("chat", false))
				switch {
				case r.err != nil && r.wrote:
					failures.Add(1)
					failed.Store(i, fmt.Sprintf("request %d: connection closed without an answer: %v", n, r.err))
					return
				case r.err != nil:
					failed.Store(i, fmt.Sprintf("request %d not written: %v", n, r.err))
					return
				case r.resp.StatusCode != 200:
					failures.Add(1)
					failed.Store(i, fmt.Sprintf("request %d: %s %s", n, r.resp.Status, r.body))
					return
				}
				if n == 0 {
					started <- struct{}{}
				}
				if r.resp.Close {
					closedByAnswer <- i
					return
				}
			}
		})
	}
	for range busy {
		<-started
	}

	d.shutdown(t, 10*time.Second)
	if r := idle[0].do(http.MethodGet, "/health", ""); r.err != nil || r.resp.StatusCode != 503 || !r.resp.Close {
		t.Errorf("health on an open connection during the stop: %+v (err %v), want 503 with Connection: close", r.resp, r.err)
	}

	for i, rc := range idle[1:] {
		r := rc.do(http.MethodPost, "/v1/chat/completions", chatBody("chat", false))
		if r.err != nil || r.resp.StatusCode != 200 || !r.resp.Close {
			t.Errorf("idle client %d sending during the stop: %+v (err %v), want 200 with Connection: close", i, r.resp, r.err)
		}
	}
	releaseOnce.Do(func() { close(release) })
	s := <-streamed
	if s.err != nil || s.resp.StatusCode != 200 || !strings.HasSuffix(s.body, "data: [DONE]\n\n") {
		t.Fatalf("stream begun before the stop: %+v %q (err %v), want it whole", s.resp, s.body, s.err)
	}
	if r := streamer.do(http.MethodPost, "/v1/chat/completions", chatBody("chat", false)); r.err != nil || r.resp.StatusCode != 200 || !r.resp.Close {
		t.Errorf("the streaming client's next request on its connection: %+v (err %v), want 200 with Connection: close", r.resp, r.err)
	}

	wg.Wait()
	failed.Range(func(k, v any) bool { t.Errorf("busy client %v: %v", k, v); return true })
	if n := len(closedByAnswer); n != busy || failures.Load() != 0 {
		t.Fatalf("%d of %d busy clients ended on an answer saying close, %d failures", n, busy, failures.Load())
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if c, err := net.Dial("tcp", d.addr); err == nil {
		c.Close()
		t.Fatal("the listener still accepts after the drain")
	}
}

// Past half the drain the listener closes even with clients connected.
// A connection idle for the grace is closed then; one whose stream ends
// after the listener closed gets the grace for its next request, which is
// served with Connection: close.
func TestDrainClosesListenerAtHalfAndCutsWithAnAnswer(t *testing.T) {
	release := make(chan struct{})
	var releaseOnce sync.Once
	u := holdingUpstream(t, release)
	d := newDrainHarness(t, u.URL)
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })

	quiet := dialRaw(t, d.addr)
	if r := quiet.do(http.MethodPost, "/v1/chat/completions", chatBody("chat", false)); r.err != nil || r.resp.StatusCode != 200 {
		t.Fatalf("before the stop: %+v", r)
	}
	first, firstDone := d.startStream(t)

	d.shutdown(t, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.clock.BlockUntilContext(ctx, 2); err != nil { // the linger and the deadline
		t.Fatal(err)
	}
	d.clock.Advance(5 * time.Second)
	d.listenerClosed(t)
	// The quiet client's connection, idle since before the stop, is
	// closed without a request on it.
	if _, err := quiet.br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("quiet connection: %v, want it closed by the server", err)
	}

	// The stream ends now; its client's next request, within the grace,
	// is served.
	releaseOnce.Do(func() { close(release) })
	if s := <-firstDone; s.err != nil || !strings.HasSuffix(s.body, "data: [DONE]\n\n") {
		t.Fatalf("stream: %q (err %v)", s.body, s.err)
	}
	if r := first.do(http.MethodPost, "/v1/chat/completions", chatBody("chat", false)); r.err != nil || r.resp.StatusCode != 200 || !r.resp.Close {
		t.Fatalf("next request after the stream, listener closed: %+v (err %v), want 200 with Connection: close", r.resp, r.err)
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// A stream still running at the drain's end ends with a final error event
// naming the stop, and Shutdown reports it: after the listener closed at
// half the drain, and when the clock passes the whole drain at once (the
// deadline must still bound the wait on connections).
func TestDrainEndCutsStreamsWithAnErrorEvent(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []time.Duration
	}{
		{"half then end", []time.Duration{2 * time.Second, 2 * time.Second}},
		{"whole drain at once", []time.Duration{4 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			u := holdingUpstream(t, release)
			d := newDrainHarness(t, u.URL)
			_, done := d.startStream(t)
			d.shutdown(t, 4*time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := d.clock.BlockUntilContext(ctx, 2); err != nil { // the linger and the deadline
				t.Fatal(err)
			}
			for i, step := range tc.steps {
				if i > 0 {
					d.listenerClosed(t)
				}
				d.clock.Advance(step)
			}
			var s exchangeResult
			select {
			case s = <-done:
			case <-time.After(10 * time.Second): // a bound for the test, not a synchronisation
				t.Fatal("the stream was not cut at the drain's end")
			}
			if !strings.Contains(s.body, `"code":"node_stopping"`) || strings.Contains(s.body, "[DONE]") {
				t.Fatalf("stream at the drain's end: %q (err %v), want a final node_stopping error event", s.body, s.err)
			}
			if err := d.wait(t); err == nil || !strings.Contains(err.Error(), "in flight") {
				t.Fatalf("Shutdown = %v, want it to say requests were still in flight", err)
			}
		})
	}
}
