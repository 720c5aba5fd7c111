package gossip

import (
	"errors"
	"fmt"
	"log"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
)

// transport carries memberlist's packets (UDP) and streams (TCP) on one
// port, as memberlist's own NetTransport does, with one difference that an
// idle node pays for: NetTransport reads every packet into a new 64 KiB
// buffer (a packet may be that large), which is cleared, kept as long as
// memberlist holds the packet, and collected. Each beat cost its receiver
// that, N/3.3 times a second; in a 40-node cluster in one process, reading
// packets was an eighth of the idle CPU and most of its large
// allocations. Here every packet is read into one buffer and handed to
// memberlist as a copy of its own size.
type transport struct {
	tcp     *net.TCPListener
	udp     *net.UDPConn
	packets chan *memberlist.Packet
	streams chan net.Conn
	log     *log.Logger

	stopping atomic.Bool
	wg       sync.WaitGroup
}

var _ memberlist.NodeAwareTransport = (*transport)(nil)

// maxPacket is the largest UDP payload: what the read buffer must hold.
const maxPacket = 65536

// udpRecvBuffer is the socket receive buffer asked for, as NetTransport
// does (halved until the system accepts it): a burst of beats from every
// member must not overflow it.
const udpRecvBuffer = 2 << 20

// newTransport listens on addr:port, TCP and UDP. Port 0 picks a port free
// for both, trying again when the UDP port is taken.
func newTransport(addr string, port int, logger *log.Logger) (*transport, error) {
	ip := net.ParseIP(addr)
	if ip == nil {
		return nil, fmt.Errorf("bind address %q: want an IP address (0.0.0.0 for every interface)", addr)
	}
	tries := 1
	if port == 0 {
		tries = 10
	}
	var err error
	for range tries {
		var t *transport
		if t, err = listen(ip, port, logger); err == nil {
			return t, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, err
}

func listen(ip net.IP, port int, logger *log.Logger) (*transport, error) {
	tcp, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip, Port: port})
	if err != nil {
		return nil, err
	}
	port = tcp.Addr().(*net.TCPAddr).Port
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port})
	if err != nil {
		_ = tcp.Close()
		return nil, err
	}
	for size := udpRecvBuffer; size > 0; size /= 2 {
		if udp.SetReadBuffer(size) == nil {
			break
		}
	}
	t := &transport{tcp: tcp, udp: udp, packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), log: logger}
	t.wg.Add(2)
	go t.accept()
	go t.read()
	return t, nil
}

// Port is the port listened on (the one picked, for port 0).
func (t *transport) Port() int { return t.tcp.Addr().(*net.TCPAddr).Port }

// FinalAdvertiseAddr is the address peers are told: the one configured,
// else the bound one. A wildcard bind needs one configured (the node
// picks it, cmd/llmgw's soleAddress), where NetTransport would guess a
// private address.
func (t *transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if ip != "" {
		a := net.ParseIP(ip)
		if a == nil {
			return nil, 0, fmt.Errorf("advertise address %q: not an IP address", ip)
		}
		if a4 := a.To4(); a4 != nil {
			a = a4
		}
		return a, port, nil
	}
	bound := t.tcp.Addr().(*net.TCPAddr)
	if bound.IP.IsUnspecified() {
		return nil, 0, fmt.Errorf("bound to the wildcard %s: set the address peers dial (advertise)", bound.IP)
	}
	return bound.IP, bound.Port, nil
}

func (t *transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	// Members' addresses are IP:port (memberlist joins names to IPs), so
	// the common case needs no resolver.
	if ap, err := netip.ParseAddrPort(a.Addr); err == nil {
		_, err = t.udp.WriteToUDPAddrPort(b, ap)
		return time.Now(), err // real time: memberlist times probes against it with its own clock
	}
	ua, err := net.ResolveUDPAddr("udp", a.Addr)
	if err != nil {
		return time.Time{}, err
	}
	_, err = t.udp.WriteTo(b, ua)
	return time.Now(), err // real time: as above
}

func (t *transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.Dial("tcp", a.Addr)
}

func (t *transport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown closes both listeners and waits for their loops.
func (t *transport) Shutdown() error {
	t.stopping.Store(true)
	_ = t.tcp.Close()
	_ = t.udp.Close()
	t.wg.Wait()
	return nil
}

// accept hands each TCP connection to memberlist, backing off on errors
// (a full file table) as NetTransport does.
func (t *transport) accept() {
	defer t.wg.Done()
	var delay time.Duration
	for {
		conn, err := t.tcp.AcceptTCP()
		if err != nil {
			if t.stopping.Load() {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t.log.Printf("[ERR] memberlist: Error accepting TCP connection: %v", err)
			time.Sleep(delay) // real time: backing off a failing accept
			continue
		}
		delay = 0
		t.streams <- conn
	}
}

// read hands each UDP packet to memberlist, in a slice of its own size:
// memberlist keeps it while the packet waits to be handled.
func (t *transport) read() {
	defer t.wg.Done()
	buf := make([]byte, maxPacket)
	for {
		n, addr, err := t.udp.ReadFromUDP(buf)
		ts := time.Now() // real time: memberlist's probe timing
		if err != nil {
			if t.stopping.Load() {
				return
			}
			t.log.Printf("[ERR] memberlist: Error reading UDP packet: %v", err)
			continue
		}
		if n < 1 {
			continue
		}
		t.packets <- &memberlist.Packet{Buf: append([]byte(nil), buf[:n]...), From: addr, Timestamp: ts}
	}
}
