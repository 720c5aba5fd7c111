package gateway

import (
	"bytes"
	"io"
	"sync"
	"sync/atomic"
)

// maxPooledBody is the largest request body kept for reuse: prompts of a
// few kilobytes to a few hundred arrive at every request, and allocating
// each anew is most of the garbage a proxied request makes; rarer, larger
// bodies are left to the collector.
const maxPooledBody = 256 << 10

// bodyBuf is a request body the gateway read, shared by the exchange and
// every attempt to send it upstream. The transport may still be reading an
// attempt's body after RoundTrip returns (it closes the body when it is
// done), so the buffer goes back to the pool only when the exchange and
// every attempt have let go of it.
type bodyBuf struct {
	b    []byte
	refs atomic.Int32
	pool *sync.Pool
}

type bodyPool struct{ p sync.Pool }

func newBodyPool() *bodyPool {
	bp := &bodyPool{}
	bp.p.New = func() any { return &bodyBuf{pool: &bp.p} }
	return bp
}

// get returns a buffer with room for n bytes, held once by the caller.
func (bp *bodyPool) get(n int) *bodyBuf {
	if n > maxPooledBody {
		bb := &bodyBuf{b: make([]byte, 0, n)}
		bb.refs.Store(1)
		return bb
	}
	bb := bp.p.Get().(*bodyBuf)
	if cap(bb.b) < n {
		bb.b = make([]byte, 0, max(n, 4<<10))
	}
	bb.b = bb.b[:0]
	bb.refs.Store(1)
	return bb
}

// release lets go of one hold; the last returns the buffer to its pool.
func (bb *bodyBuf) release() {
	if bb.refs.Add(-1) == 0 && bb.pool != nil && cap(bb.b) <= maxPooledBody {
		bb.pool.Put(bb)
	}
}

// reader is one attempt's view of body (a part of bb.b or the buffer
// itself), holding bb until the transport closes it.
func (bb *bodyBuf) reader(body []byte) io.ReadCloser {
	bb.refs.Add(1)
	return &heldReader{Reader: bytes.NewReader(body), bb: bb}
}

type heldReader struct {
	*bytes.Reader
	bb   *bodyBuf
	once sync.Once
}

func (h *heldReader) Close() error {
	h.once.Do(h.bb.release)
	return nil
}
