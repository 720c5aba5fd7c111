package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// standIn is a node stand-in answering GET paths with fixed JSON bodies;
// a path it lacks is a 404 in the node's error shape.
func standIn(t *testing.T, answers map[string]any) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := answers[r.URL.Path]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "no " + r.URL.Path + " here"})
			return
		}
		_ = json.NewEncoder(w).Encode(a)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// `llmgw models` says where clients send requests: every alive node's
// gateway, https where the node serves TLS; --json lists them beside the
// deployments.
func TestModelsShowsTheGateways(t *testing.T) {
	srv := standIn(t, map[string]any{
		"/v1/cluster": status.ClusterInfo{Self: "n1", Members: []status.MemberInfo{
			{Name: "n1", State: gossip.StateAlive, Gateway: "10.0.0.1:8000"},
			{Name: "n2", State: gossip.StateAlive, Gateway: "10.0.0.2:8443", GatewayTLS: true},
			{Name: "n3", State: gossip.StateDead, Gateway: "10.0.0.3:8000"}, // not reachable
			{Name: "n4", State: gossip.StateAlive},                          // runs no gateway
		}},
		"/v1/deployments": []status.DeploymentInfo{
			{Deployment: placement.Deployment{Name: "chat", Model: "m/tiny", Engine: "fake", Replicas: 2}, Placed: 2, Ready: 2, Nodes: []string{"n1", "n2"}},
		},
	})
	out, err := run(t, "models", "--addr", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	first, rest, _ := strings.Cut(out, "\n")
	if want := "GATEWAYS  http://10.0.0.1:8000 (n1), https://10.0.0.2:8443 (n2); OpenAI clients use <gateway>/v1"; first != want {
		t.Errorf("first line %q, want %q", first, want)
	}
	if strings.Contains(out, "10.0.0.3") {
		t.Errorf("a dead node's gateway is offered:\n%s", out)
	}
	if !regexp.MustCompile(`(?m)^NAME\s+MODEL\s+ENGINE\s+REPLICAS\s+READY\s+NODES\s+WHY\n^chat\s+m/tiny\s+fake\s+2/2\s+2\s+n1,n2\s+-$`).MatchString(rest) {
		t.Errorf("no deployment table below the gateways:\n%s", out)
	}

	js, err := run(t, "models", "--json", "--addr", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var got modelsJSON
	if err := json.Unmarshal([]byte(js), &got); err != nil {
		t.Fatalf("models --json: %v\n%s", err, js)
	}
	want := []status.GatewayInfo{{Node: "n1", URL: "http://10.0.0.1:8000"}, {Node: "n2", URL: "https://10.0.0.2:8443"}}
	if fmt.Sprint(got.Gateways) != fmt.Sprint(want) || len(got.Deployments) != 1 || got.Deployments[0].Name != "chat" {
		t.Errorf("models --json = %+v, want gateways %v and the chat deployment\n%s", got, want, js)
	}
}

// With no gateway anywhere, models says so rather than offer nothing, and
// --json gives empty lists, not null.
func TestModelsWithoutGateways(t *testing.T) {
	srv := standIn(t, map[string]any{
		"/v1/cluster":     status.ClusterInfo{Self: "n1", Members: []status.MemberInfo{{Name: "n1", State: gossip.StateAlive}}},
		"/v1/deployments": []status.DeploymentInfo{},
	})
	out, err := run(t, "models", "--addr", srv.URL)
	if err != nil || !strings.HasPrefix(out, "GATEWAYS  none: no alive node runs a gateway") {
		t.Errorf("models: %v\n%s", err, out)
	}
	js, err := run(t, "models", "--json", "--addr", srv.URL)
	if err != nil || !strings.Contains(js, `"gateways": []`) || !strings.Contains(js, `"deployments": []`) {
		t.Errorf("models --json: %v\n%s", err, js)
	}
}

// A node whose gateway serves TLS says so in its record, so `llmgw models`
// offers https, and the gateway does answer there over TLS.
func TestGatewayTLSIsPublished(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	n := startNode(t, "n1", filepath.Join(dir, "n1"), "--gateway-tls-cert", certFile, "--gateway-tls-key", keyFile)
	var url string
	testwait.Until(t, 10*time.Second, "n1 publishes its gateway", func() (bool, string) {
		out, err := run(t, "models", "--addr", n.api)
		if err != nil {
			return false, err.Error()
		}
		first, _, _ := strings.Cut(out, "\n")
		m := regexp.MustCompile(`^GATEWAYS  (https://127\.0\.0\.1:\d+) \(n1\)`).FindStringSubmatch(first)
		if m == nil {
			return false, first
		}
		url = m[1]
		return true, ""
	})
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(url + "/health")
	if err != nil {
		t.Fatalf("GET %s/health: %v", url, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil {
		t.Fatalf("GET %s/health: %s (tls %v)", url, resp.Status, resp.TLS != nil)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key into dir, and
// returns their paths and a pool that trusts the certificate.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "llmgw test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "gw.crt"), filepath.Join(dir, "gw.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// An autoscaled deployment shows its target with its range, and the
// decider's last word when nothing else is wrong; one at zero says a
// request wakes it, with its last cold start.
func TestModelsShowsAutoscaling(t *testing.T) {
	srv := standIn(t, map[string]any{
		"/v1/cluster": status.ClusterInfo{Self: "n1", Members: []status.MemberInfo{{Name: "n1", State: gossip.StateAlive, Gateway: "10.0.0.1:8000"}}},
		"/v1/deployments": []status.DeploymentInfo{
			{Deployment: placement.Deployment{Name: "chat", Model: "m/tiny", Engine: "fake", Replicas: 3, Autoscale: &placement.Autoscale{Min: 1, Max: 4}},
				Placed: 3, Ready: 2, Nodes: []string{"n1"}, Scale: &status.ScaleInfo{Target: 3, Decider: "n2", Reason: "scaling up: 20 in flight"}},
			{Deployment: placement.Deployment{Name: "idle", Model: "m/tiny", Engine: "fake", Replicas: 0, Autoscale: &placement.Autoscale{Min: 0, Max: 2}},
				Scale: &status.ScaleInfo{Decider: "n1", Reason: "scaled to zero", LastColdStart: 6500 * time.Millisecond}},
			{Deployment: placement.Deployment{Name: "timed", Model: "m/tiny", Engine: "fake", Replicas: 0, Autoscale: &placement.Autoscale{Min: 0, Max: 2}},
				Scale: &status.ScaleInfo{Decider: "n1", Reason: "scaled to zero", LastColdStart: 6600 * time.Millisecond,
					LastColdStartPull: 0, LastColdStartLoad: 2100 * time.Millisecond}},
		},
	})
	out, err := run(t, "models", "--addr", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^chat\s+m/tiny\s+fake\s+3/3 \(auto 1-4\)\s+2\s+n1\s+autoscale: scaling up: 20 in flight \(decided by n2\)$`),
		regexp.MustCompile(`(?m)^idle\s+m/tiny\s+fake\s+0/0 \(auto 0-2\)\s+0\s+-\s+scaled to zero, wakes on request \(last cold start 6.5s\)$`),
		regexp.MustCompile(`(?m)^timed\s+.*scaled to zero, wakes on request \(last cold start 6.6s: pull 0s, load and warm-up 2.1s, deciding, placing and gossip 4.5s\)$`),
	} {
		if !want.MatchString(out) {
			t.Errorf("models lacks %s:\n%s", want, out)
		}
	}
}

// LoRA adapters are listed under their deployment: the source, how many
// ready replicas list it, and why another does not.
func TestModelsShowsAdapters(t *testing.T) {
	srv := standIn(t, map[string]any{
		"/v1/cluster": status.ClusterInfo{Self: "n1", Members: []status.MemberInfo{{Name: "n1", State: gossip.StateAlive, Gateway: "10.0.0.1:8000"}}},
		"/v1/deployments": []status.DeploymentInfo{
			{Deployment: placement.Deployment{Name: "chat", Model: "m/tiny", Engine: "vllm", Replicas: 2, MaxLoras: 2},
				Placed: 2, Ready: 2, Nodes: []string{"n1", "n2"}, AdapterStatus: []status.AdapterInfo{
					{Name: "sql", Source: "adapters/sql", Replicas: []string{"chat-0", "chat-1"}},
					{Name: "late", Source: "adapters/late", Replicas: []string{"chat-1"}, Errors: []string{"chat-0: /v1/load_lora_adapter answered 404: No adapter found for adapters/late"}},
				}},
		},
	})
	out, err := run(t, "models", "--addr", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^  sql\s+adapters/sql\s+adapter\s+-\s+2\s+chat-0,chat-1\s+-$`),
		regexp.MustCompile(`(?m)^  late\s+adapters/late\s+adapter\s+-\s+1\s+chat-1\s+not registered on chat-0: /v1/load_lora_adapter answered 404: No adapter found for adapters/late$`),
	} {
		if !want.MatchString(out) {
			t.Errorf("models lacks %s:\n%s", want, out)
		}
	}
}
