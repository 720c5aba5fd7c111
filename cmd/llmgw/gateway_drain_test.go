package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
)

// A real node's gateway on SIGTERM (its context ends): /health says 503
// at once, to fresh connections and on a keep-alive connection the client
// already had open, whose request is answered (with Connection: close)
// rather than the connection closed under it; then the node stops.
// Before that, once the node has settled, /health says 200.
func TestGatewayStopAnswersOpenConnections(t *testing.T) {
	n := startNode(t, "n1", filepath.Join(t.TempDir(), "n1"), "--gateway-access-log=false")
	addr := publishedGateway(t, n).Gateway
	health := func(c net.Conn, br *bufio.Reader) (*http.Response, error) {
		if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: gw\r\n\r\n"); err != nil {
			return nil, err
		}
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodGet})
		if err != nil {
			return nil, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, err
	}
	kept, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()
	keptR := bufio.NewReader(kept)
	testwait.Until(t, 10*time.Second, "the settled gateway's health says 200", func() (bool, string) {
		resp, err := health(kept, keptR)
		if err != nil {
			t.Fatalf("health on a keep-alive connection: %v", err)
		}
		return resp.StatusCode == 200 && !resp.Close, resp.Status
	})

	n.stop()
	testwait.Until(t, 5*time.Second, "health says 503 once the node stops", func() (bool, string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false, err.Error() // the kept connection holds the listener open
		}
		defer c.Close()
		resp, err := health(c, bufio.NewReader(c))
		if err != nil {
			return false, err.Error()
		}
		return resp.StatusCode == http.StatusServiceUnavailable && resp.Close, resp.Status
	})
	resp, err := health(kept, keptR)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || !resp.Close {
		t.Fatalf("health on the connection open before the stop: %v (err %v), want 503 with Connection: close", resp, err)
	}
	select {
	case err := <-n.done:
		n.done <- err
		if err != nil {
			t.Fatalf("node up: %v", err)
		}
	case <-time.After(20 * time.Second): // a bound for the test, not a synchronisation
		t.Fatal("the node did not stop once its gateway's last connection closed")
	}
}

// --gateway-drain-timeout is checked before anything starts, and its
// error names the flag and the range.
func TestGatewayDrainTimeoutFlag(t *testing.T) {
	dir := t.TempDir()
	base := []string{"node", "up", "--name", "n1", "--data-dir", filepath.Join(dir, "data"), "--bind", "127.0.0.1:0", "--api", "127.0.0.1:0", "--gateway", "127.0.0.1:0"}
	for _, v := range []string{"0s", "100ms", "2h"} {
		_, err := run(t, append(append([]string{}, base...), "--gateway-drain-timeout", v)...)
		if err == nil || !strings.Contains(err.Error(), "--gateway-drain-timeout") || !strings.Contains(err.Error(), "1s to 1h") {
			t.Errorf("--gateway-drain-timeout %s: %v, want an error naming the flag and its range", v, err)
		}
	}
}
