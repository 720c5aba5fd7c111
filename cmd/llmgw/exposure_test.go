package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/gateway"
	"github.com/llmgw/llmgw/supervisor/status"
)

// outsideAddress is an address of this machine that is not loopback: what
// another host dials. Where the machine has none, a dummy interface gets
// one for the test (root and iproute2 needed); the test skips, saying so,
// only when neither is possible.
func outsideAddress(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			return ipn.IP.String()
		}
	}
	const link, addr = "llmgwexp0", "198.51.100.77"
	if os.Geteuid() != 0 {
		t.Skip("this machine has no address but loopback, and without root no dummy interface can be added to give it one")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("this machine has no address but loopback, and no ip command (iproute2) to add a dummy interface")
	}
	for _, args := range [][]string{{"link", "add", link, "type", "dummy"}, {"addr", "add", addr + "/32", "dev", link}, {"link", "set", link, "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			exec.Command("ip", "link", "del", link).Run()
			t.Skipf("this machine has no address but loopback, and a dummy interface could not be added (ip %s: %v: %s)", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() { exec.Command("ip", "link", "del", link).Run() })
	return addr
}

// vllmShim puts a `vllm` on PATH that is the fake engine's vllm
// personality (this test binary as `llmgw engine fake --personality
// vllm`), so the vllm profile's own command line runs.
func vllmShim(t *testing.T) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := "#!/bin/sh\nexec '" + strings.ReplaceAll(self, "'", `'\''`) + "' engine fake --personality vllm \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "vllm"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// No path of an engine that runs the model is reachable from another
// host without an llmgw credential. A real node (`node up`, the process
// runtime) runs deployment "chat" on the vllm profile, whose engine is the
// fake's vllm personality: like vLLM, it answers /invocations, /pooling,
// /score and /tokenize without its key. From the machine's non-loopback
// address (what another host dials), none of them, nor /v1/chat/
// completions, answers at the engine's port, and the node's relay refuses
// every call it was not signed for. On loopback the same paths answer,
// so the test sees an exposure when there is one (before cluster version
// 4, engines listened on every address).
func TestEnginePathsUnreachableFromAnotherHost(t *testing.T) {
	ip := outsideAddress(t)
	vllmShim(t)
	dir := filepath.Join(t.TempDir(), "n1")
	stopEngines(t, dir)
	api := net.JoinHostPort(ip, strconv.Itoa(freePort(t)))
	args := []string{"node", "up", "--name", "n1", "--data-dir", dir, "--bind", net.JoinHostPort(ip, strconv.Itoa(freePort(t))),
		"--api", api, "--gateway", "127.0.0.1:0", "--profile", "local", "--runtime", "process", "--simulate-gpus", "1xH100-80GB",
		"--engine-ports", "23300-23399", "--gateway-access-log=false"}
	n := startNodeWith(t, args, api)
	tok, err := os.ReadFile(datadir.New(dir).TokenFile())
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tok))
	if out, err := run(t, "place", "chat", "--model", "m/tiny", "--engine", "vllm", "--gpu-memory", "20GiB", "--addr", n.api, "--token", token); err != nil {
		t.Fatalf("place: %v\n%s", err, out)
	}
	var shard status.ShardInfo
	testwait.Until(t, 60*time.Second, "chat's engine is ready", func() (bool, string) {
		var shards []status.ShardInfo
		if err := getJSON(n.api+"/v1/shards", &shards); err != nil || len(shards) != 1 {
			return false, fmt.Sprint(shards, err)
		}
		shard = shards[0]
		return shard.Status == "ready" && shard.Lease == placement.LeaseValid, fmt.Sprintf("%+v", shard)
	})
	t.Cleanup(func() {
		if out, err := run(t, "unplace", "chat", "--addr", n.api, "--token", token); err != nil {
			t.Errorf("unplace: %v\n%s", err, out)
		}
		testwait.Until(t, 30*time.Second, "chat's engine stops", func() (bool, string) {
			var shards []status.ShardInfo
			err := getJSON(n.api+"/v1/shards", &shards)
			return err == nil && len(shards) == 0, fmt.Sprint(shards, err)
		})
	})
	if !shard.Private || !strings.HasPrefix(shard.URL, "http://"+ip+":") {
		t.Errorf("shard %+v: want a private engine whose record names %s", shard, ip)
	}
	_, port, _ := strings.Cut(strings.TrimPrefix(shard.URL, "http://"), ":")
	engineID := placement.EngineID(shard.ShardID, shard.SpecVersion)

	cl := &http.Client{Timeout: 5 * time.Second}
	defer cl.CloseIdleConnections()
	post := func(url, body string) (int, string, error) {
		resp, err := cl.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	chat := `{"model":"chat","messages":[{"role":"user","content":"hello"}]}`
	paths := map[string]string{
		"/invocations":           chat,
		"/pooling":               `{"model":"chat","input":"hello"}`,
		"/score":                 `{"model":"chat","text_1":"hello","text_2":"world"}`,
		"/tokenize":              `{"model":"chat","prompt":"hello"}`,
		"/v1/chat/completions":   chat,
		"/v1/completions":        `{"model":"chat","prompt":"hello"}`,
		"/v1/embeddings":         `{"model":"chat","input":"hello"}`,
		"/reset_prefix_cache":    ``,
		"/detokenize":            `{"model":"chat","tokens":[1,2]}`,
		"/v1/models":             ``,
		"/rerank":                `{"model":"chat","query":"a","documents":["b"]}`,
		"/inference/v1/generate": chat,
	}
	for path, body := range paths {
		code, answer, err := post("http://"+net.JoinHostPort(ip, port)+path, body)
		if err == nil {
			t.Errorf("POST %s at the engine's port from %s: %d %.200s, want no answer", path, ip, code, answer)
		}
	}
	// The positive control: on loopback the engine is vLLM, whose key
	// does not guard these paths, so an engine listening on every address
	// would have answered above.
	if code, answer, err := post("http://127.0.0.1:"+port+"/invocations", chat); err != nil || code != http.StatusOK {
		t.Fatalf("POST /invocations on loopback: %d %.200s %v, want 200 (the engine's own behaviour)", code, answer, err)
	}
	// The node's relay, on the API other hosts reach, runs nothing
	// without a signature from a node holding the cluster token; the
	// engine's own key is no credential there, and it forwards no path
	// outside the gateway's.
	relay := "http://" + api + gateway.RelayPath + engineID
	for path, body := range paths {
		code, answer, err := post(relay+path, body)
		if err != nil || (code != http.StatusUnauthorized && code != http.StatusNotFound) {
			t.Errorf("POST %s through the relay without a signature: %d %.200s %v, want 401 or 404", path, code, answer, err)
		}
	}
	// And the gateway, the one way in, serves it.
	self := publishedGateway(t, n)
	if code, answer, err := post(self.GatewayURL()+"/v1/chat/completions", chat); err != nil || code != http.StatusOK {
		t.Fatalf("through the gateway: %d %.200s %v", code, answer, err)
	}
}
