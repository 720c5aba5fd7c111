package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// bufPool holds the relay buffers: one per request in flight would
// otherwise be garbage at every request.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// readerPool holds the event streams' buffered readers, for the same
// reason: bufio.NewReaderSize allocates its own 32 KiB each time.
var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 32<<10) }}

// eventEnd ends a server-sent event (engines end lines with "\n").
var eventEnd = []byte("\n\n")

// maxEvent bounds how much of one server-sent event is held before it is
// passed on anyway.
const maxEvent = 1 << 20

// errAborted is relay's word that a plain answer broke off after its
// status went to the client: the client's connection must be aborted
// (forward does it, once the attempt's books are closed).
var errAborted = errors.New("gateway: the answer broke off after its status went out")

// relay passes the engine's answer to the client. The status and headers go
// first; a stream of server-sent events is then passed event by event,
// each flushed as it completes, and anything else as it arrives. How the
// answer broke off, if it did, goes in out.
//
// A stream is committed to at once: the client learns that its stream
// began. A plain answer is committed to only with its first byte read, so
// that until then a failure can still be retried or answered in full
// (504, 503) instead of cutting a response whose status went out: when it
// is not, a.committed is false and err says why.
func (x *exchange) relay(a *attempt, resp *http.Response, out *outcome) error {
	defer resp.Body.Close()
	resp.Body = &watchedBody{ReadCloser: resp.Body, a: a}
	if x.held && (resp.StatusCode != http.StatusOK || !isEventStream(resp.Header)) {
		// A held stream's 200 went out already: the engine's refusal
		// (a 4xx, say) is its final error event.
		x.commit(a, resp)
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		_ = x.write(sseError("upstream_"+strconv.Itoa(resp.StatusCode), fmt.Sprintf("the engine answered %d: %s", resp.StatusCode, bytes.TrimSpace(b))))
		_ = x.rc.Flush()
		return nil
	}
	if isEventStream(resp.Header) {
		x.commit(a, resp)
		x.entry.stream = true
		// The client learns at once that its stream began.
		_ = x.rc.Flush()
		x.relayEvents(a, resp, out)
		return nil
	}
	return x.relayBody(a, resp, out)
}

// commit sends the engine's status and headers to the client.
func (x *exchange) commit(a *attempt, resp *http.Response) {
	a.committed = true
	x.begun.Store(true)
	if x.held {
		x.status = resp.StatusCode // the stream's own 200 went out while it waited
		return
	}
	lr := a.lr
	h := x.w.Header()
	for k, vs := range cleanHeader(resp.Header) {
		h[k] = vs
	}
	h.Set("Llmgw-Replica", lr.ReplicaID)
	h.Set("Llmgw-Node", lr.Node)
	x.g.closing(x.w)
	x.w.WriteHeader(resp.StatusCode)
	x.status = resp.StatusCode
}

func isEventStream(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	enc := h.Get("Content-Encoding")
	// A compressed stream cannot be split into events; it is passed on
	// as it arrives instead.
	return err == nil && mt == "text/event-stream" && (enc == "" || enc == "identity")
}

// write sends b to the client, noting the first byte.
func (x *exchange) write(b []byte) error {
	if x.ttfb == 0 && len(b) > 0 {
		x.ttfb = max(x.g.clock.Since(x.start), time.Nanosecond)
	}
	n, err := x.w.Write(b)
	x.entry.bytesOut += int64(n)
	if err != nil {
		x.clientGone()
	}
	return err
}

// relayBody copies a body that is not an event stream, committing to it
// once its first byte (or its end) is read. An engine that dies part-way,
// or goes quiet past the stream-idle bound, leaves a body that must not
// pass for a whole one: relayBody answers errAborted, and the client's
// connection is aborted, so it sees a failed transfer instead.
func (x *exchange) relayBody(a *attempt, resp *http.Response, out *outcome) error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var n int
	var err error
	for n == 0 && err == nil {
		n, err = resp.Body.Read(buf)
	}
	if n == 0 && !errors.Is(err, io.EOF) {
		return err
	}
	x.commit(a, resp)
	chunked := resp.ContentLength < 0
	for {
		if n > 0 {
			if (x.key != nil || x.span != nil) && len(x.body)+n <= maxUsageBody {
				x.body = append(x.body, buf[:n]...)
			}
			if x.write(buf[:n]) != nil {
				return nil
			}
			if chunked {
				_ = x.rc.Flush()
			}
		}
		if errors.Is(err, io.EOF) {
			if u, ok := usageOf(x.body); ok {
				x.use = u
			}
			return nil
		}
		if err != nil {
			if x.r.Context().Err() != nil {
				x.clientGone()
				return nil
			}
			brokeOff(a, err, "answer", out)
			return errAborted
		}
		n, err = resp.Body.Read(buf)
	}
}

// brokeOff records in out an answer that ended early after the client got
// its status, and says why, as the client's error event does: the engine
// broke it off, or the gateway cut it (a bound, or the engine left
// routing). Of these, only a first-byte timeout counts against the
// replica (done): a stream that goes quiet had its first byte, which
// cleared the replica's failures, so one more would never add up to an
// ejection; a hung engine leaves routing by its readiness instead, and its
// streams are cut then (Update).
func brokeOff(a *attempt, err error, what string, out *outcome) (code, msg string) {
	lr := a.lr
	if c := a.cut(); c != nil {
		out.broke, out.note = c.reason, c.msg
		return c.code(), c.msg
	}
	out.broke, out.note = reasonStream, "engine broke off the "+what+": "+err.Error()
	return "upstream_stream_error", fmt.Sprintf("the engine of replica %s on %s broke off the %s: %v", lr.ReplicaID, lr.Node, what, err)
}

// relayEvents passes server-sent events one at a time. An event is only
// written whole, so when the engine dies mid-stream the client gets the
// events that completed and then a final error event, never half an event
// or a stream that merely stops.
func (x *exchange) relayEvents(a *attempt, resp *http.Response, out *outcome) {
	br := readerPool.Get().(*bufio.Reader)
	br.Reset(resp.Body)
	defer func() {
		br.Reset(nil) // not holding the body past the answer
		readerPool.Put(br)
	}()
	var ev []byte
	line := 0 // bytes of the current line read so far
	// The inter-token latency is taken between the events that carry
	// output, each timed as it is written to the client: one clock
	// reading per such event (the first reuses the time to first byte's
	// when it is the answer's first byte), none for the others.
	var lastToken time.Time
	var itl prometheus.Observer // resolved at the first interval, then reused
	emit := func() bool {
		if x.key != nil || x.span != nil {
			if u, ok := usageOf(eventData(ev)); ok {
				x.use = u // the last chunk's usage covers the whole answer
			}
		}
		token := carriesToken(ev)
		first := x.ttfb == 0
		if x.write(ev) != nil {
			return false
		}
		if token {
			var now time.Time
			if first {
				now = x.start.Add(x.ttfb) // the instant write just read
			} else {
				now = x.g.clock.Now()
			}
			if !lastToken.IsZero() {
				if itl == nil {
					itl = x.g.m.itl.WithLabelValues(x.model)
				}
				itl.Observe(now.Sub(lastToken).Seconds())
			}
			lastToken = now
		}
		ev = ev[:0]
		// Events that arrived together leave together: when the next
		// event is already whole in the buffer, it is written first and
		// the flush covers both. Nothing waits for bytes still to come.
		if n := br.Buffered(); n > 0 {
			if next, _ := br.Peek(n); bytes.Contains(next, eventEnd) {
				return true
			}
		}
		if x.rc.Flush() != nil {
			x.gone = true
			return false
		}
		return true
	}
	for {
		chunk, err := br.ReadSlice('\n')
		ev = append(ev, chunk...)
		if n := len(chunk); n > 0 && chunk[n-1] == '\n' {
			total := line + n
			line = 0
			// A blank line ("\n" or "\r\n") ends the event.
			if (total == 1 || (total == 2 && ev[len(ev)-2] == '\r')) && !emit() {
				return
			}
		} else {
			line += n
		}
		if len(ev) > maxEvent && !emit() {
			return
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if len(ev) > 0 {
				emit()
			}
			return
		case x.r.Context().Err() != nil:
			x.clientGone()
			return
		default:
			code, msg := brokeOff(a, err, "stream", out)
			ev = ev[:0]
			_ = x.write(sseError(code, msg))
			_ = x.rc.Flush()
			return
		}
	}
}

// tokenKeys are the members whose string value is generated output in a
// stream's chunks: a chat delta's content (and the reasoning of the
// engines that stream it apart), a completion's text, and a tool call's
// arguments.
var tokenKeys = [][]byte{[]byte(`"content"`), []byte(`"text"`), []byte(`"arguments"`), []byte(`"reasoning_content"`), []byte(`"reasoning"`)}

// carriesToken reports whether a server-sent event carries output: one of
// tokenKeys as a key (followed by ':') with a non-empty string value. The
// events without (a chat's role chunk, whose content is "", the finish
// and usage chunks, [DONE], comments, an error) are not tokens, and the
// inter-token latency passes over them.
//
// It is a byte search, not a parse, for it runs on every event: inside a
// JSON string a quote is escaped, so a quoted key followed by a colon is a
// key; a key split across two data lines of one event is missed, which no
// engine does. A token chunk finds its key at once ("content" or "text"
// comes early); only the few others are searched through.
func carriesToken(ev []byte) bool {
	for _, k := range tokenKeys {
		for b := ev; ; {
			i := bytes.Index(b, k)
			if i < 0 {
				break
			}
			b = b[i+len(k):]
			j := skipSpace(b, 0)
			if j >= len(b) || b[j] != ':' {
				continue
			}
			j = skipSpace(b, j+1)
			if j+1 < len(b) && b[j] == '"' && b[j+1] != '"' {
				return true
			}
		}
	}
	return false
}

// watchedBody is an answer's body as the attempt reads it: each read feeds
// the bounds, and a read the gateway cut says why.
type watchedBody struct {
	io.ReadCloser
	a *attempt
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case errors.Is(err, io.EOF):
		b.a.progress(true)
	case n > 0:
		b.a.progress(false)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		if c := b.a.cut(); c != nil {
			err = c
		}
	}
	return n, err
}

// progress notes a read of the answer's body that brought bytes, or its
// end: the first byte proves the engine answers, and starts the idle
// bound, which every later read starts afresh.
//
// The proof counts at once, not when the attempt is done: an ejected
// replica that answers again (panic mode) takes requests from its first
// byte on, not from the end of a long stream.
func (a *attempt) progress(end bool) {
	if !a.begun.Swap(true) && !a.failing {
		a.lr.rep.health.answered()
	}
	switch {
	case end || a.idle <= 0:
		if a.timer != nil {
			a.timer.Stop()
		}
	case a.timer == nil:
		a.timer = a.clock.AfterFunc(a.idle, a.expire)
	default:
		a.timer.Reset(a.idle)
	}
}

// expire cancels the attempt when its timer fires: which bound it was is
// whether a byte had come.
func (a *attempt) expire() {
	lr := a.lr
	if a.begun.Load() {
		a.cancel(&cutError{reason: reasonStreamIdle, msg: fmt.Sprintf("replica %s on %s sent nothing more of its answer for %v (the stream-idle bound)",
			lr.ReplicaID, lr.Node, a.idle)})
		return
	}
	a.cancel(&cutError{reason: reasonFirstByte, msg: fmt.Sprintf("replica %s on %s sent no byte of its answer within %v (the first-byte bound)",
		lr.ReplicaID, lr.Node, a.firstByte)})
}
