package gateway

import (
	"io"
	"testing"
)

// A body goes back to the pool only when the exchange and every attempt's
// reader have let go: the transport may read an attempt's body after
// RoundTrip returned, and a reused buffer would send it another request's
// bytes.
func TestBodyBufHeldUntilEveryReaderCloses(t *testing.T) {
	bp := newBodyPool()
	bb := bp.get(5)
	bb.b = append(bb.b, "hello"...)
	r1, r2 := bb.reader(bb.b), bb.reader(bb.b[1:])
	bb.release() // the exchange ends first
	if got := bb.refs.Load(); got != 2 {
		t.Fatalf("holds after the exchange let go: %d, want 2 readers", got)
	}
	b, _ := io.ReadAll(r2)
	if string(b) != "ello" {
		t.Fatalf("second attempt read %q", b)
	}
	_ = r1.Close()
	_ = r1.Close() // a transport may close twice; it counts once
	if got := bb.refs.Load(); got != 1 {
		t.Fatalf("holds after one reader closed (twice): %d, want 1", got)
	}
	_ = r2.Close()
	if got := bb.refs.Load(); got != 0 {
		t.Fatalf("holds after all let go: %d", got)
	}
	big := bp.get(maxPooledBody + 1)
	if big.pool != nil {
		t.Fatal("a body over the pooled size came from the pool")
	}
	big.release()
}
