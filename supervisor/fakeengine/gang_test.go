package fakeengine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
)

// gangRank0 starts rank 0 of a gang of n on loopback and returns its HTTP
// base URL, its master address, and the channel Run's result comes on.
func gangRank0(t *testing.T, ctx context.Context, n int, g Gang) (string, string, <-chan error) {
	t.Helper()
	web, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	master, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.NNodes, g.NodeRank, g.Listener = n, 0, master
	done := make(chan error, 1)
	go func() { done <- RunGang(ctx, Config{Model: "big", Listener: web}, g) }()
	return "http://" + web.Addr().String(), master.Addr().String(), done
}

func member(ctx context.Context, n, rank int, master string, g Gang) <-chan error {
	host, port, _ := net.SplitHostPort(master)
	g.NNodes, g.NodeRank, g.MasterAddr = n, rank, host
	fmt.Sscan(port, &g.MasterPort)
	done := make(chan error, 1)
	go func() { done <- RunGang(ctx, Config{Model: "big"}, g) }()
	return done
}

func healthCode(url string) int {
	resp, err := http.Get(url + "/health")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func wantPeerLost(t *testing.T, what string, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, ErrPeerLost) || ExitCode(err) == 0 {
			t.Fatalf("%s returned %v (exit code %d), want ErrPeerLost and a non-zero exit", what, err, ExitCode(err))
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not exit after losing its peer", what)
	}
}

// Rank 0 is healthy only once every other rank has connected; when one of
// them goes away, rank 0 exits non-zero.
func TestGangRank0HealthyOnlyWhenAllConnected(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url, master, done0 := gangRank0(t, ctx, 3, Gang{})
	testwait.Until(t, 5*time.Second, "rank 0 answers /health", func() (bool, string) {
		c := healthCode(url)
		return c == http.StatusServiceUnavailable, fmt.Sprint(c)
	})
	m1ctx, stop1 := context.WithCancel(ctx)
	done1 := member(m1ctx, 3, 1, master, Gang{})
	// One of two connected: still not healthy.
	testwait.StaysTrue(t, 700*time.Millisecond, "rank 0 unhealthy with rank 2 missing", func() (bool, string) {
		c := healthCode(url)
		return c == http.StatusServiceUnavailable, fmt.Sprint(c)
	})
	done2 := member(ctx, 3, 2, master, Gang{})
	testwait.Until(t, 5*time.Second, "rank 0 healthy with every rank connected", func() (bool, string) {
		c := healthCode(url)
		return c == http.StatusOK, fmt.Sprint(c)
	})
	stop1() // rank 1 goes away (a clean exit closes its connection)
	if err := <-done1; err != nil {
		t.Fatalf("rank 1 stopped by its context returned %v", err)
	}
	wantPeerLost(t, "rank 0", done0)
	// Rank 0's exit breaks rank 2's connection: it exits non-zero too.
	wantPeerLost(t, "rank 2", done2)
}

// A rank above 0 that loses rank 0 exits non-zero.
func TestGangMemberExitsWhenRank0Dies(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r0ctx, stop0 := context.WithCancel(ctx)
	url, master, done0 := gangRank0(t, r0ctx, 2, Gang{})
	done1 := member(ctx, 2, 1, master, Gang{})
	testwait.Until(t, 5*time.Second, "rank 0 healthy", func() (bool, string) {
		c := healthCode(url)
		return c == http.StatusOK, fmt.Sprint(c)
	})
	stop0()
	if err := <-done0; err != nil {
		t.Fatalf("rank 0 stopped by its context returned %v", err)
	}
	wantPeerLost(t, "rank 1", done1)
}

// A peer that stays connected but says nothing (frozen, or its host gone
// without a reset) is lost after PeerTimeout, as a collective times out.
func TestGangSilentPeerIsLost(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := Gang{Heartbeat: 50 * time.Millisecond, PeerTimeout: time.Second}
	url, master, done0 := gangRank0(t, ctx, 2, g)
	c, err := net.Dial("tcp", master)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "%s 1 2\n", hello)
	testwait.Until(t, 5*time.Second, "rank 0 healthy with the raw peer", func() (bool, string) {
		c := healthCode(url)
		return c == http.StatusOK, fmt.Sprint(c)
	})
	wantPeerLost(t, "rank 0", done0)
}

// A connection that is not a member of this gang (wrong size, rank 0, a
// rank out of range, garbage) is refused and makes nobody healthy.
func TestGangRefusesStrangers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url, master, done0 := gangRank0(t, ctx, 2, Gang{PeerTimeout: 500 * time.Millisecond})
	for _, line := range []string{hello + " 1 3", hello + " 0 2", hello + " 2 2", "GET / HTTP/1.1"} {
		c, err := net.Dial("tcp", master)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "%s\n", line)
		defer c.Close()
	}
	testwait.StaysTrue(t, time.Second, "rank 0 unhealthy with only strangers connected", func() (bool, string) {
		c := healthCode(url)
		return c == http.StatusServiceUnavailable, fmt.Sprint(c)
	})
	cancel()
	if err := <-done0; err != nil {
		t.Fatalf("rank 0 returned %v", err)
	}
}

func TestGangFlagsChecked(t *testing.T) {
	for _, g := range []Gang{{NNodes: 1}, {NNodes: 2, NodeRank: 2, MasterAddr: "a", MasterPort: 1}, {NNodes: 2, MasterPort: 1}, {NNodes: 2, MasterAddr: "a"}} {
		if err := RunGang(context.Background(), Config{Model: "m"}, g); err == nil || !strings.Contains(err.Error(), "--") {
			t.Errorf("%+v: err = %v, want one naming the flag", g, err)
		}
	}
}

// With HangOnPeerLoss a rank that loses its peer keeps running, as vLLM's
// ranks hang: rank 0 still answers /health, and the member idles until it
// is stopped. Only the supervisor's gang teardown ends such a gang.
func TestGangHangOnPeerLoss(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r0ctx, stop0 := context.WithCancel(ctx)
	url, master, done0 := gangRank0(t, r0ctx, 2, Gang{HangOnPeerLoss: true})
	m1ctx, stop1 := context.WithCancel(ctx)
	done1 := member(m1ctx, 2, 1, master, Gang{HangOnPeerLoss: true})
	testwait.Until(t, 5*time.Second, "rank 0 healthy", func() (bool, string) {
		c := healthCode(url)
		return c == http.StatusOK, fmt.Sprint(c)
	})
	stop0()
	if err := <-done0; err != nil {
		t.Fatalf("rank 0 returned %v", err)
	}
	select {
	case err := <-done1:
		t.Fatalf("rank 1 exited (%v) after losing rank 0; want it to hang on", err)
	case <-time.After(500 * time.Millisecond):
	}
	stop1()
	if err := <-done1; err != nil {
		t.Fatalf("rank 1 stopped by its context returned %v", err)
	}

	// Rank 0 hangs on too: healthy after its member left.
	url, master, done0 = gangRank0(t, ctx, 2, Gang{HangOnPeerLoss: true})
	m2ctx, stop2 := context.WithCancel(ctx)
	done2 := member(m2ctx, 2, 1, master, Gang{})
	testwait.Until(t, 5*time.Second, "rank 0 healthy", func() (bool, string) {
		c := healthCode(url)
		return c == http.StatusOK, fmt.Sprint(c)
	})
	stop2()
	<-done2
	testwait.StaysTrue(t, 700*time.Millisecond, "rank 0 still healthy after losing rank 1", func() (bool, string) {
		c := healthCode(url)
		return c == http.StatusOK, fmt.Sprint(c)
	})
	cancel()
	if err := <-done0; err != nil {
		t.Fatalf("rank 0 returned %v", err)
	}
}
