package gateway

import (
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
)

// logEntry is one request as the access log tells it: where it went and
// how it went, never what it said.
type logEntry struct {
	at       time.Time
	method   string
	path     string
	model    string // the deployment, or what the client asked for when it resolved to none
	replica  string
	node     string
	status   int
	ttfb     time.Duration
	duration time.Duration
	bytesIn  int64
	bytesOut int64
	attempts int
	stream   bool
	key      string // the API key's name from the keys file, never the key
	err      string
}

// accessLog writes entries on a goroutine of its own, through a bounded
// queue: a slow or blocked writer (a full disk, a stalled pipe) costs log
// lines, counted, never request latency.
type accessLog struct {
	w       io.Writer
	ch      chan logEntry
	dropped func()
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

func newAccessLog(w io.Writer, size int, dropped func()) *accessLog {
	l := &accessLog{w: w, ch: make(chan logEntry, size), dropped: dropped, stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l
}

// add queues e, or drops it when the queue is full. It never blocks, and is
// safe after close (the entry is then dropped).
func (l *accessLog) add(e logEntry) {
	select {
	case <-l.stop:
		l.dropped()
		return
	default:
	}
	select {
	case l.ch <- e:
	default:
		l.dropped()
	}
}

func (l *accessLog) run() {
	defer close(l.done)
	var buf []byte
	write := func(e logEntry) {
		buf = e.format(buf[:0])
		_, _ = l.w.Write(buf)
	}
	for {
		select {
		case e := <-l.ch:
			write(e)
		case <-l.stop:
			// What was queued before the stop is still written.
			for {
				select {
				case e := <-l.ch:
					write(e)
				default:
					return
				}
			}
		}
	}
}

// close writes what is queued and stops the writer.
func (l *accessLog) close() {
	l.once.Do(func() { close(l.stop) })
	<-l.done
}

// format appends e as one logfmt line.
func (e *logEntry) format(b []byte) []byte {
	b = e.at.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, " gateway"...)
	kv := func(k, v string) {
		if v == "" {
			return
		}
		b = append(b, ' ')
		b = append(b, k...)
		b = append(b, '=')
		if strings.ContainsAny(v, " \"=\t\n\\") {
			b = strconv.AppendQuote(b, v)
		} else {
			b = append(b, v...)
		}
	}
	kv("method", e.method)
	kv("path", e.path)
	kv("model", e.model)
	kv("replica", e.replica)
	kv("node", e.node)
	b = append(b, " status="...)
	b = strconv.AppendInt(b, int64(e.status), 10)
	if e.ttfb > 0 {
		kv("ttfb", e.ttfb.String())
	}
	kv("duration", e.duration.String())
	b = append(b, " bytes_in="...)
	b = strconv.AppendInt(b, e.bytesIn, 10)
	b = append(b, " bytes_out="...)
	b = strconv.AppendInt(b, e.bytesOut, 10)
	if e.attempts > 1 {
		b = append(b, " attempts="...)
		b = strconv.AppendInt(b, int64(e.attempts), 10)
	}
	if e.stream {
		b = append(b, " stream=true"...)
	}
	kv("key", e.key)
	kv("error", e.err)
	return append(b, '\n')
}
