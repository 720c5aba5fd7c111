package gossip

import (
	"bytes"
	"io"
	"log"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// Every packet reaches memberlist in a slice of its own size, which later
// packets do not overwrite: memberlist holds a packet while it waits to be
// handled. memberlist's NetTransport gave each one a fresh 64 KiB buffer.
func TestTransportHandsEachPacketInItsOwnSize(t *testing.T) {
	tr, err := newTransport("127.0.0.1", 0, log.New(io.Discard, "", 0))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown()
	conn, err := net.Dial("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(tr.Port())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	recv := func() *memberlist.Packet {
		select {
		case p := <-tr.PacketCh():
			return p
		case <-time.After(5 * time.Second):
			t.Fatal("no packet within 5s")
			return nil
		}
	}
	first := bytes.Repeat([]byte{'a'}, 100)
	if _, err := conn.Write(first); err != nil {
		t.Fatal(err)
	}
	p1 := recv()
	if _, err := conn.Write(bytes.Repeat([]byte{'b'}, 300)); err != nil {
		t.Fatal(err)
	}
	p2 := recv()
	if !bytes.Equal(p1.Buf, first) {
		t.Errorf("the first packet changed after the second was read: %q...", p1.Buf[:8])
	}
	if len(p2.Buf) != 300 {
		t.Errorf("second packet: %d bytes, want 300", len(p2.Buf))
	}
	for i, p := range []*memberlist.Packet{p1, p2} {
		if cap(p.Buf) > 2*len(p.Buf) {
			t.Errorf("packet %d: %d bytes in a buffer of %d", i+1, len(p.Buf), cap(p.Buf))
		}
	}
	if _, _, err := tr.FinalAdvertiseAddr("", 0); err != nil {
		t.Errorf("bound to loopback, no advertise address: %v", err)
	}
	wild, err := newTransport("0.0.0.0", 0, log.New(io.Discard, "", 0))
	if err != nil {
		t.Fatal(err)
	}
	defer wild.Shutdown()
	if _, _, err := wild.FinalAdvertiseAddr("", 0); err == nil {
		t.Error("bound to the wildcard with no advertise address: no error")
	}
}
