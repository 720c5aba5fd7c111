package fakeengine

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Gang makes the fake engine one member of a replica that spans nodes, as
// vLLM's multi-node launch does (--nnodes, --node-rank, --master-addr,
// --master-port, --headless): rank 0 listens on the master port and serves
// HTTP; every other rank dials rank 0, serves no HTTP, and holds the
// connection. Rank 0's /health answers 200 only while every other rank is
// connected. A rank whose peer connection breaks (the peer died, or went
// silent past PeerTimeout) exits non-zero, as NCCL's watchdog would end a
// process whose collective peer is gone.
type Gang struct {
	NNodes     int
	NodeRank   int
	MasterAddr string
	MasterPort int
	// Heartbeat is how often each side writes to the other, and
	// PeerTimeout how long a side waits for a line before it takes the
	// peer for dead. Defaults: 500 ms and 3 s.
	Heartbeat, PeerTimeout time.Duration
	// DialFor bounds how long a rank above 0 keeps dialing rank 0 before
	// it gives up (rank 0 may start after it). Default: 2 min.
	DialFor time.Duration
	// HangOnPeerLoss makes a rank that loses a peer keep running instead
	// of exiting: rank 0 keeps answering (healthy) and the others keep
	// idling, as vLLM's multi-node ranks hang when one dies (vllm#48720)
	// and SGLang's rank 0 runs on after a peer's NCCL timeout
	// (sglang#3099). Only llmgw's own gang teardown stops such a gang.
	HangOnPeerLoss bool
	// Listener, when set, is rank 0's master listener (tests bind port 0).
	Listener net.Listener
}

// ErrPeerLost is what RunGang returns when a peer's connection broke;
// ExitCode maps it to 1.
var ErrPeerLost = errors.New("fake engine: gang peer lost")

// RunMaybeGang runs cfg alone when g is nil or spans one node, and as a
// gang member otherwise: what `llmgw engine fake` runs.
func RunMaybeGang(ctx context.Context, cfg Config, g *Gang) error {
	if g == nil || g.NNodes <= 1 {
		return Run(ctx, cfg)
	}
	return RunGang(ctx, cfg, *g)
}

// hello is the first line a rank above 0 sends rank 0.
const hello = "llmgw-fake-gang"

func (g *Gang) defaults() error {
	if g.Heartbeat <= 0 {
		g.Heartbeat = 500 * time.Millisecond
	}
	if g.PeerTimeout <= 0 {
		g.PeerTimeout = 3 * time.Second
	}
	if g.DialFor <= 0 {
		g.DialFor = 2 * time.Minute
	}
	switch {
	case g.NNodes < 2 || g.NNodes > 64:
		return fmt.Errorf("fake engine: --nnodes %d, want 2 to 64 for a gang", g.NNodes)
	case g.NodeRank < 0 || g.NodeRank >= g.NNodes:
		return fmt.Errorf("fake engine: --node-rank %d, want 0 to %d", g.NodeRank, g.NNodes-1)
	case g.MasterAddr == "" && g.Listener == nil:
		return errors.New("fake engine: --master-addr is required in a gang")
	case (g.MasterPort < 1 || g.MasterPort > 65535) && g.Listener == nil:
		return fmt.Errorf("fake engine: --master-port %d, want 1 to 65535", g.MasterPort)
	}
	return nil
}

// RunGang runs cfg as rank g.NodeRank of a gang until ctx is done (nil) or
// a peer is lost (an error wrapping ErrPeerLost).
func RunGang(ctx context.Context, cfg Config, g Gang) error {
	if err := g.defaults(); err != nil {
		return err
	}
	if g.NodeRank > 0 {
		return runMember(ctx, cfg, g)
	}
	return runRank0(ctx, cfg, g)
}

// runRank0 accepts the other ranks and serves HTTP, healthy once all of
// them are connected.
func runRank0(ctx context.Context, cfg Config, g Gang) error {
	ln := g.Listener
	if ln == nil {
		addr := net.JoinHostPort(g.MasterAddr, strconv.Itoa(g.MasterPort))
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			return fmt.Errorf("fake engine: gang: listen on %s: %w", addr, err)
		}
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, "%s fake engine gang rank 0: %s\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
		}
	}
	var (
		mu     sync.Mutex
		joined = map[int]bool{}
	)
	lost := make(chan error, g.NNodes)
	gctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	context.AfterFunc(gctx, func() { ln.Close() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				rank, err := greet(c, g)
				if err == nil {
					mu.Lock()
					if joined[rank] {
						err = fmt.Errorf("rank %d is already connected", rank)
					}
					joined[rank] = true
					n := len(joined)
					mu.Unlock()
					if err == nil {
						logf("rank %d connected (%d of %d)", rank, n, g.NNodes-1)
					}
				}
				if err != nil {
					logf("refused a connection from %s: %v", c.RemoteAddr(), err)
					c.Close()
					return
				}
				if err := hold(gctx, c, g); err != nil {
					lost <- fmt.Errorf("%w: rank %d: %w", ErrPeerLost, rank, err)
				}
			}()
		}
	}()
	cfg.Healthy = func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(joined) == g.NNodes-1
	}
	served := make(chan error, 1)
	go func() { served <- Run(gctx, cfg) }()
	for {
		select {
		case err := <-served:
			return err
		case err := <-lost:
			if g.HangOnPeerLoss {
				logf("%v; hanging on (--hang-on-peer-loss)", err)
				continue
			}
			logf("%v; exiting", err)
			cancel()
			<-served
			return err
		}
	}
}

// greet reads a member's hello line: "llmgw-fake-gang <rank> <nnodes>".
func greet(c net.Conn, g Gang) (int, error) {
	_ = c.SetReadDeadline(time.Now().Add(g.PeerTimeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 0, err
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != hello {
		return 0, fmt.Errorf("bad hello %q", line)
	}
	rank, err1 := strconv.Atoi(f[1])
	n, err2 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil || n != g.NNodes || rank < 1 || rank >= g.NNodes {
		return 0, fmt.Errorf("hello %q does not fit a gang of %d", strings.TrimSpace(line), g.NNodes)
	}
	return rank, nil
}

// hold keeps one peer connection: it writes a heartbeat every Heartbeat
// and wants a line from the peer within PeerTimeout. It returns nil when
// ctx ends, and the error when the peer is gone.
func hold(ctx context.Context, c net.Conn, g Gang) error {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	errc := make(chan error, 1)
	go func() {
		t := time.NewTicker(g.Heartbeat)
		defer t.Stop()
		for {
			if _, err := c.Write([]byte("beat\n")); err != nil {
				errc <- err
				return
			}
			select {
			case <-ctx.Done():
				errc <- nil
				return
			case <-t.C:
			}
		}
	}()
	rd := bufio.NewReader(c)
	var err error
	for {
		_ = c.SetReadDeadline(time.Now().Add(g.PeerTimeout))
		if _, err = rd.ReadString('\n'); err != nil {
			break
		}
	}
	c.Close()
	werr := <-errc
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = werr
	}
	return err
}

// runMember dials rank 0 (again and again until DialFor, since rank 0 may
// start later), says who it is, and holds the connection. It serves no
// HTTP: with vLLM's --headless, only rank 0 does.
func runMember(ctx context.Context, cfg Config, g Gang) error {
	addr := net.JoinHostPort(g.MasterAddr, strconv.Itoa(g.MasterPort))
	if g.Listener != nil {
		addr = g.Listener.Addr().String()
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, "%s fake engine gang rank %d: %s\n", time.Now().UTC().Format(time.RFC3339Nano), g.NodeRank, fmt.Sprintf(format, args...))
		}
	}
	deadline := time.Now().Add(g.DialFor)
	var d net.Dialer
	for {
		dctx, cancel := context.WithTimeout(ctx, g.PeerTimeout)
		c, err := d.DialContext(dctx, "tcp", addr)
		cancel()
		if err == nil {
			if _, err = fmt.Fprintf(c, "%s %d %d\n", hello, g.NodeRank, g.NNodes); err == nil {
				logf("connected to rank 0 at %s", addr)
				if err := hold(ctx, c, g); err != nil {
					if g.HangOnPeerLoss {
						logf("lost rank 0: %v; hanging on (--hang-on-peer-loss)", err)
						<-ctx.Done()
						return nil
					}
					logf("lost rank 0: %v; exiting", err)
					return fmt.Errorf("%w: rank 0 at %s: %w", ErrPeerLost, addr, err)
				}
				return nil
			}
			c.Close()
		}
		if ctx.Err() != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: rank 0 at %s did not answer within %s: %w", ErrPeerLost, addr, g.DialFor, err)
		}
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// gangFlags registers the gang flags on fs for MainForTests.
func gangFlags(fs *flag.FlagSet) *Gang {
	g := &Gang{}
	fs.IntVar(&g.NNodes, "nnodes", 1, "")
	fs.IntVar(&g.NodeRank, "node-rank", 0, "")
	fs.StringVar(&g.MasterAddr, "master-addr", "", "")
	fs.IntVar(&g.MasterPort, "master-port", 0, "")
	fs.Bool("headless", false, "")
	fs.BoolVar(&g.HangOnPeerLoss, "hang-on-peer-loss", false, "")
	return g
}
