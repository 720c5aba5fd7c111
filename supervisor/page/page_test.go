package page

import (
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement/fit/fittest"
	"github.com/llmgw/llmgw/probes/weights/weightstest"
	"github.com/llmgw/llmgw/supervisor"
	"github.com/llmgw/llmgw/supervisor/supervisortest"
)

const token = "page-test-token-0123456789abcdef"

func startNode(t *testing.T, name string, labels map[string]string, join ...int) (*supervisor.Node, int) {
	t.Helper()
	return startWith(t, name, labels, func(*supervisor.Config) {}, join...)
}

// startWith is startNode with cfg adjusted by mut before the start.
func startWith(t *testing.T, name string, labels map[string]string, mut func(*supervisor.Config), join ...int) (*supervisor.Node, int) {
	t.Helper()
	cfg := supervisortest.Config(t, name, join...)
	cfg.Token, cfg.Version, cfg.Labels = token, "v-test", labels
	cfg.Extra = func(n *supervisor.Node, mux *http.ServeMux) { Register(n, mux, Options{}) }
	mut(&cfg)
	n := supervisortest.Start(t, cfg)
	return n, supervisortest.GossipPort(t, n)
}

func get(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func place(t *testing.T, n *supervisor.Node, spec string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+n.APIAddr()+"/v1/deployments", strings.NewReader(spec))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("place %s: %s", spec, resp.Status)
	}
}

func TestClusterPage(t *testing.T) {
	// The gateways are only published, not served: the page draws what
	// the records say. A wildcard host is published as the advertised one.
	weightsDir := t.TempDir()
	if _, err := weightstest.WriteHubCache(weightsDir, "meta-llama/Llama-3.1-8B", fittest.Llama31_8B(), 1); err != nil {
		t.Fatal(err)
	}
	a, aport := startWith(t, "alpha", map[string]string{"rack": `<script>alert("r1")</script>`}, func(c *supervisor.Config) {
		c.GatewayAddr, c.WeightsDir = "0.0.0.0:18000", weightsDir
	})
	b, _ := startWith(t, "bravo", map[string]string{"zone": "b&w"}, func(c *supervisor.Config) { c.GatewayAddr, c.GatewayTLS = "127.0.0.1:18443", true }, aport)
	place(t, a, `{"name":"chat","model":"m/tiny","engine":"fake","replicas":2}`)
	place(t, a, `{"name":"huge","model":"m/huge","engine":"fake","tensor_parallel":8,"gpu_memory":"70GiB"}`)

	// Drawn by bravo from its own view: it must know alpha, both
	// deployments, the placed shards and the refused one.
	var page string
	testwait.Until(t, 20*time.Second, "the page shows the converged cluster", func() (bool, string) {
		code, h, body := get(t, "http://"+b.APIAddr()+"/")
		if code != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/html") {
			t.Fatalf("GET /: %d %s", code, h.Get("Content-Type"))
		}
		page = body
		return strings.Contains(page, "<b>2 / 2</b><span>nodes alive") && strings.Contains(page, "huge-0") &&
			strings.Count(page, `class="ok">ready</td>`) == 2, "\n" + page
	})
	for _, want := range []string{
		"as seen by <b>bravo</b>",
		`<meta http-equiv="refresh" content="10">`,
		">alpha</a>", ">bravo</a> <span class=\"self\">this node</span>",
		`href="http://` + a.APIAddr() + `/"`,
		"NVIDIA H100 80GB", "0.0 GiB / 80.0 GiB", `style="width:0%"`,
		"<td>chat</td>", "<td>m/tiny</td>", "2 / 2 / 2",
		"<td>huge</td>", "0 / 0 / 1", "8 GPUs, 70GiB each", "needs 8 GPUs", // why not
		"chat-0", "chat-1", `class="ok">valid</td>`, `class="bad">unplaced</td><td class="dim">none</td>`, `<span class="tag">chat-`, // shard rows
		"simulated GPUs",
		// What alpha's weights dir holds.
		`weights cached:</span> <span class="tag">meta-llama/Llama-3.1-8B (`, " KiB)</span>",
		// Each node's gateway, with its scheme, linking to its models;
		// the line at the top names this node's.
		`<a href="http://127.0.0.1:18000/v1/models">http://127.0.0.1:18000</a>`,
		`<a href="https://127.0.0.1:18443/v1/models">https://127.0.0.1:18443</a>`,
		`Clients send OpenAI-compatible requests to any node's gateway, e.g. <a href="https://127.0.0.1:18443/v1/models">https://127.0.0.1:18443/v1</a> (this node's; 2 gateways in the table below)`,
		"&lt;script&gt;alert(&#34;r1&#34;)&lt;/script&gt;", // the label, escaped
		"zone=b&amp;w",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(page, "<script>") || strings.Contains(page, "ZgotmplZ") {
		t.Errorf("page carries unescaped script or a value the template refused")
	}
	if strings.Contains(page, "http://") && strings.Count(page, "<link") > 0 {
		t.Errorf("page loads external assets")
	}
	if code, _, _ := get(t, "http://"+b.APIAddr()+"/no-such-page"); code != 404 {
		t.Errorf("GET /no-such-page: %d, want 404", code)
	}
	if dir := os.Getenv("LLMGW_PAGE_OUT"); dir != "" {
		if err := os.WriteFile(dir+"/cluster.html", []byte(page), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPageWithNoDeployments(t *testing.T) {
	a, _ := startNode(t, "solo", nil)
	code, _, body := get(t, "http://"+a.APIAddr()+"/")
	if code != 200 || !strings.Contains(body, "nothing placed yet") || !strings.Contains(body, "no shards") ||
		!strings.Contains(body, "No alive node runs a gateway") || !strings.Contains(body, `<span class="dim">none</span>`) {
		t.Errorf("empty cluster page: %d\n%s", code, body)
	}
}
