package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/freeport"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/supervisor/datadir"
	"github.com/llmgw/llmgw/supervisor/status"
)

const testToken = "test-token-0123456789abcdef"

type harness struct {
	t     *testing.T
	nodes map[string]*Node
	cfgs  map[string]Config
}

func newHarness(t *testing.T) *harness {
	return &harness{t: t, nodes: map[string]*Node{}, cfgs: map[string]Config{}}
}

// freePort finds a loopback port free for both TCP and UDP, so a node
// can be restarted at the same gossip address.
func freePort(t *testing.T) int {
	t.Helper()
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func (h *harness) config(name string, join ...string) Config {
	h.t.Helper()
	if cfg, ok := h.cfgs[name]; ok {
		return cfg
	}
	sim, err := gpu.NewSimulated("4xH100-80GB", name)
	if err != nil {
		h.t.Fatal(err)
	}
	prof, _ := gossip.ProfileByName("local")
	cfg := Config{
		Name: name, DataDir: h.t.TempDir(), BindAddr: "127.0.0.1", BindPort: freePort(h.t),
		APIAddr: fmt.Sprintf("127.0.0.1:%d", freePort(h.t)), Join: join, Token: testToken,
		Profile: prof, GPUs: sim, GPUsSimulated: true, LeaseTTL: 3 * time.Second, Version: "test",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), TestHooks: true,
	}
	h.cfgs[name] = cfg
	return cfg
}

func (h *harness) start(name string, join ...string) *Node {
	h.t.Helper()
	cfg := h.config(name, join...)
	_, restart := h.nodes[name]
	n, err := Start(context.Background(), cfg)
	// Another test process may take a port between config's pick and this
	// bind. A first start takes new ports (read them back through
	// gossipAddr, not from an earlier config); a restart must keep its
	// address.
	for try := 0; err != nil && !restart && try < 3 && strings.Contains(err.Error(), "address already in use"); try++ {
		cfg.BindPort, cfg.APIAddr = freePort(h.t), fmt.Sprintf("127.0.0.1:%d", freePort(h.t))
		h.cfgs[name] = cfg
		n, err = Start(context.Background(), cfg)
	}
	if err != nil {
		h.t.Fatalf("start %s: %v", name, err)
	}
	h.nodes[name] = n
	h.t.Cleanup(func() { _ = n.Kill() })
	return n
}

func (h *harness) gossipAddr(name string) string {
	return fmt.Sprintf("127.0.0.1:%d", h.cfgs[name].BindPort)
}

func call(t *testing.T, method, url, token string, body []byte, out any) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("decode %s: %v: %s", url, err, raw)
		}
	}
	return resp.StatusCode
}

func api(n *Node, path string) string { return "http://" + n.APIAddr() + path }

func planJSON(t *testing.T, n *Node) string {
	var p PlanInfo
	call(t, "GET", api(n, "/v1/plan"), "", nil, &p)
	b, _ := json.Marshal(p.Plan)
	return string(b)
}

// threeNodes starts a, b, c in an order where b and c know only a, and a is
// started last: joins are retried until a answers.
func threeNodes(t *testing.T) (*harness, []*Node) {
	h := newHarness(t)
	h.config("a")
	b := h.start("b", h.gossipAddr("a"))
	c := h.start("c", h.gossipAddr("a"))
	a := h.start("a")
	nodes := []*Node{a, b, c}
	for _, n := range nodes {
		testwait.Until(t, 15*time.Second, n.Name()+" sees 3 alive members", func() (bool, string) {
			var ci status.ClusterInfo
			call(t, "GET", api(n, "/v1/cluster"), "", nil, &ci)
			alive := 0
			for _, m := range ci.Members {
				if m.State == gossip.StateAlive && len(m.GPUs) == 4 {
					alive++
				}
			}
			return alive == 3, fmt.Sprint(alive)
		})
	}
	return h, nodes
}

func TestPlaceReachesEveryNodeAndPlansAgree(t *testing.T) {
	_, nodes := threeNodes(t)
	spec := []byte(`{"name":"chat","model":"m/tiny","engine":"fake","replicas":2}`)
	if code := call(t, "POST", api(nodes[1], "/v1/deployments"), testToken, spec, nil); code != 200 {
		t.Fatalf("place: HTTP %d", code)
	}
	for _, n := range nodes {
		testwait.Until(t, 5*time.Second, n.Name()+" knows chat with 2 ready replicas", func() (bool, string) {
			var deps []status.DeploymentInfo
			call(t, "GET", api(n, "/v1/deployments"), "", nil, &deps)
			return len(deps) == 1 && deps[0].Name == "chat" && deps[0].Ready == 2 && len(deps[0].Nodes) == 2, fmt.Sprintf("%+v", deps)
		})
	}
	testwait.Until(t, 5*time.Second, "every node's /v1/plan is identical", func() (bool, string) {
		p0 := planJSON(t, nodes[0])
		for _, n := range nodes[1:] {
			if p := planJSON(t, n); p != p0 {
				return false, p0 + " vs " + p
			}
		}
		return strings.Count(p0, `"shard_id"`) == 2, p0
	})
	// Placing the same spec again answers with what runs, not with zeros.
	var again status.DeploymentInfo
	if code := call(t, "POST", api(nodes[2], "/v1/deployments"), testToken, spec, &again); code != 200 || again.Placed != 2 || again.Ready != 2 || again.Change != status.ChangeUnchanged {
		t.Fatalf("placing chat again: HTTP %d, placed %d ready %d, change %q; want 2, 2 and %q", code, again.Placed, again.Ready, again.Change, status.ChangeUnchanged)
	}
	// A setting that restarts nothing (update; start_timeout too, once
	// the cluster runs protocol 2: TestPlaceRefusesAFieldTheActiveVersionDoesNotKnow)
	// is a change of its own, not "unchanged": the new setting is stored,
	// the spec version and every engine stay.
	settings := []byte(`{"name":"chat","model":"m/tiny","engine":"fake","replicas":2,"update":"recreate"}`)
	var tuned status.DeploymentInfo
	if code := call(t, "POST", api(nodes[2], "/v1/deployments"), testToken, settings, &tuned); code != 200 || tuned.Change != status.ChangeSettings || tuned.SpecVersion != again.SpecVersion {
		t.Fatalf("placing chat with update recreate: HTTP %d, change %q, spec %s; want %q and spec %s", code, tuned.Change, tuned.SpecVersion, status.ChangeSettings, again.SpecVersion)
	}
	// Each plan names the specs it was computed from, and says it is current.
	var deps []status.DeploymentInfo
	call(t, "GET", api(nodes[0], "/v1/deployments"), "", nil, &deps)
	for _, n := range nodes {
		testwait.Until(t, 5*time.Second, n.Name()+"'s plan is current and computed from chat", func() (bool, string) {
			var p PlanInfo
			call(t, "GET", api(n, "/v1/plan"), "", nil, &p)
			return p.Current && len(p.Deployments) == 1 && p.Deployments["chat"] == deps[0].SpecVersion, fmt.Sprintf("current=%v deployments=%v", p.Current, p.Deployments)
		})
	}
}

// Reading deployments needs no token, but env values and key-like
// arguments are shown only to callers with it.
func TestDeploymentSecretsNeedTheToken(t *testing.T) {
	h := newHarness(t)
	n := h.start("a")
	spec := []byte(`{"name":"chat","model":"m","replicas":0,"env":{"HF_TOKEN":"hf_secret"},
		"args":["--api-key","sk-secret","--max-model-len","4096","--hf-token=hf_other"]}`)
	if code := call(t, "POST", api(n, "/v1/deployments"), testToken, spec, nil); code != 200 {
		t.Fatalf("place: HTTP %d", code)
	}
	get := func(token string) placement.Deployment {
		var deps []status.DeploymentInfo
		if code := call(t, "GET", api(n, "/v1/deployments"), token, nil, &deps); code != 200 || len(deps) != 1 {
			t.Fatalf("GET: HTTP %d, %d deployments", code, len(deps))
		}
		return deps[0].Deployment
	}
	anon := get("")
	if v := anon.Env["HF_TOKEN"]; v == "" || strings.Contains(v, "secret") {
		t.Errorf("without the token env HF_TOKEN = %q, want it redacted", v)
	}
	if strings.Contains(strings.Join(anon.Args, " "), "secret") || strings.Contains(strings.Join(anon.Args, " "), "hf_other") ||
		anon.Args[0] != "--api-key" || anon.Args[2] != "--max-model-len" || anon.Args[3] != "4096" {
		t.Errorf("without the token args = %q, want key values redacted and the rest kept", anon.Args)
	}
	full := get(testToken)
	if full.Env["HF_TOKEN"] != "hf_secret" || full.Args[1] != "sk-secret" || full.Args[4] != "--hf-token=hf_other" {
		t.Errorf("with the token: env %v args %q, want them whole", full.Env, full.Args)
	}
}

func TestMutationsNeedTheToken(t *testing.T) {
	h := newHarness(t)
	n := h.start("a")
	spec := []byte(`{"name":"chat","model":"m","replicas":1}`)
	if code := call(t, "POST", api(n, "/v1/deployments"), "", spec, nil); code != http.StatusUnauthorized {
		t.Fatalf("no token: HTTP %d, want 401", code)
	}
	if code := call(t, "POST", api(n, "/v1/deployments"), "wrong-token-xxxxxxxxxxxx", spec, nil); code != http.StatusForbidden {
		t.Fatalf("wrong token: HTTP %d, want 403", code)
	}
	if code := call(t, "DELETE", api(n, "/v1/deployments/chat"), "", nil, nil); code != http.StatusUnauthorized {
		t.Fatalf("unplace without token: HTTP %d, want 401", code)
	}
	var deps []status.DeploymentInfo
	call(t, "GET", api(n, "/v1/deployments"), "", nil, &deps)
	if len(deps) != 0 {
		t.Fatalf("refused calls changed state: %+v", deps)
	}
}

func TestInvalidSpecNamesTheFieldAndChangesNothing(t *testing.T) {
	h := newHarness(t)
	n := h.start("a")
	for body, field := range map[string]string{
		`{"name":"Bad_Name","model":"m"}`:            "name",
		`{"name":"ok","model":"m","replicas":-1}`:    "replicas",
		`{"name":"ok","model":"m","engine":"nope"}`:  "engine",
		`{"name":"ok","model":"m","colour":"blue"}`:  "colour",
		"name: ok\nmodel: m\ntensor_parallel: 0.5\n": "tensor_parallel",
	} {
		req, _ := http.NewRequest("POST", api(n, "/v1/deployments"), strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), field) {
			t.Errorf("%s: HTTP %d %s; want 400 naming %q", body, resp.StatusCode, raw, field)
		}
	}
	var deps []status.DeploymentInfo
	call(t, "GET", api(n, "/v1/deployments"), "", nil, &deps)
	if len(deps) != 0 {
		t.Fatalf("invalid specs changed state: %+v", deps)
	}
}

func TestKilledNodesShardsMoveToLiveNodes(t *testing.T) {
	_, nodes := threeNodes(t)
	// 3 replicas of 4 GPUs each: one per node, nothing to spare.
	spec := []byte(`{"name":"big","model":"m","engine":"fake","replicas":2,"tensor_parallel":4}`)
	call(t, "POST", api(nodes[0], "/v1/deployments"), testToken, spec, nil)
	var victim string
	testwait.Until(t, 5*time.Second, "both replicas placed", func() (bool, string) {
		p := nodes[0].Plan()
		if len(p.Assignments) != 2 {
			return false, fmt.Sprint(p)
		}
		victim = p.Assignments[0].Node
		return true, ""
	})
	var survivors []*Node
	for _, n := range nodes {
		if n.Name() == victim {
			_ = n.Kill()
		} else {
			survivors = append(survivors, n)
		}
	}
	bound := nodes[0].cfg.Profile.DetectionBound(3) + nodes[0].cfg.LeaseTTL
	for _, n := range survivors {
		testwait.Until(t, bound+2*time.Second, n.Name()+" re-places the dead node's shard", func() (bool, string) {
			p := n.Plan()
			nodesUsed := map[string]bool{}
			for _, a := range p.Assignments {
				nodesUsed[a.Node] = true
			}
			return len(p.Assignments) == 2 && !nodesUsed[victim], fmt.Sprintf("%+v", p)
		})
	}
}

func TestUnplaceRemovesShardsEverywhere(t *testing.T) {
	_, nodes := threeNodes(t)
	call(t, "POST", api(nodes[0], "/v1/deployments"), testToken, []byte(`{"name":"chat","model":"m","replicas":3}`), nil)
	testwait.Until(t, 5*time.Second, "3 shards held", func() (bool, string) {
		held := 0
		for _, n := range nodes {
			held += len(n.Cluster().Local().Shards)
		}
		return held == 3, fmt.Sprint(held)
	})
	if code := call(t, "DELETE", api(nodes[2], "/v1/deployments/chat"), testToken, nil, nil); code != 200 {
		t.Fatalf("unplace: HTTP %d", code)
	}
	if code := call(t, "DELETE", api(nodes[2], "/v1/deployments/chat"), testToken, nil, nil); code != 404 {
		t.Fatalf("second unplace: HTTP %d, want 404", code)
	}
	for _, n := range nodes {
		testwait.Until(t, 5*time.Second, n.Name()+" holds nothing and shows nothing", func() (bool, string) {
			var shards []status.ShardInfo
			call(t, "GET", api(n, "/v1/shards"), "", nil, &shards)
			return len(n.Cluster().Local().Shards) == 0 && len(shards) == 0, fmt.Sprint(shards)
		})
	}
}

func TestWholeClusterRestartKeepsDeployments(t *testing.T) {
	h, nodes := threeNodes(t)
	call(t, "POST", api(nodes[0], "/v1/deployments"), testToken, []byte(`{"name":"one","model":"m"}`), nil)
	call(t, "POST", api(nodes[1], "/v1/deployments"), testToken, []byte(`{"name":"two","model":"m"}`), nil)
	call(t, "POST", api(nodes[1], "/v1/deployments"), testToken, []byte(`{"name":"gone","model":"m"}`), nil)
	testwait.Until(t, 5*time.Second, "c learns gone", func() (bool, string) {
		_, ok := nodes[2].Cluster().Deployment("gone")
		return ok, ""
	})
	if code := call(t, "DELETE", api(nodes[2], "/v1/deployments/gone"), testToken, nil, nil); code != 200 {
		t.Fatalf("unplace gone: HTTP %d", code)
	}
	for _, n := range nodes {
		testwait.Until(t, 5*time.Second, n.Name()+" knows both", func() (bool, string) {
			var deps []status.DeploymentInfo
			call(t, "GET", api(n, "/v1/deployments"), "", nil, &deps)
			return len(deps) == 2, fmt.Sprint(len(deps))
		})
	}
	// Every node remembers its peers in its data dir...
	for _, n := range nodes {
		testwait.Until(t, 5*time.Second, n.Name()+" remembers 2 peers", func() (bool, string) {
			id, _, err := datadir.New(n.cfg.DataDir).ReadIdentity()
			return len(id.Peers) == 2, fmt.Sprint(id.Peers, err)
		})
	}
	for _, n := range nodes {
		if err := n.Leave(time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// ...so they come back in another order with no --join at all.
	for _, name := range []string{"a", "b", "c"} {
		cfg := h.cfgs[name]
		cfg.Join = nil
		h.cfgs[name] = cfg
	}
	c := h.start("c")
	b := h.start("b")
	a := h.start("a")
	for _, n := range []*Node{a, b, c} {
		testwait.Until(t, 10*time.Second, n.Name()+" knows one and two placed, not gone", func() (bool, string) {
			var deps []status.DeploymentInfo
			call(t, "GET", api(n, "/v1/deployments"), "", nil, &deps)
			names := []string{}
			placed := 0
			for _, d := range deps {
				names = append(names, d.Name)
				placed += d.Placed
			}
			return fmt.Sprint(names) == "[one two]" && placed == 2, fmt.Sprint(names, placed)
		})
	}
}

// A start that fails returns its error, closes what it opened, and
// touches nothing it did not make. Before the fix a deferred cleanup
// dereferenced the node that "return nil, err" had just set to nil, and
// its panic hid the real error: a truncated deployments.json and a gossip
// port in use both crashed the agent with a nil dereference.
func TestStartErrorsCleanUp(t *testing.T) {
	hold := func(t *testing.T, addr string) {
		t.Helper()
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, cfg Config)
		want  []string
	}{
		{"a truncated deployments.json", func(t *testing.T, cfg Config) {
			if err := os.WriteFile(filepath.Join(cfg.DataDir, "deployments.json"), []byte(`{"format_version":1,"deployments":[{"name":"a"`), 0o600); err != nil {
				t.Fatal(err)
			}
		}, []string{"deployments.json", "move the file aside"}},
		{"the gossip port in use", func(t *testing.T, cfg Config) {
			hold(t, fmt.Sprintf("127.0.0.1:%d", cfg.BindPort))
		}, []string{"gossip: listen on 127.0.0.1:", "address already in use"}},
		{"the API port in use", func(t *testing.T, cfg Config) {
			hold(t, cfg.APIAddr)
		}, []string{"--api 127.0.0.1:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := newHarness(t).config("a")
			cfg.TestHooks = false // what `llmgw node up` runs: memberlist's own transport
			tc.setup(t, cfg)
			n, err := Start(context.Background(), cfg)
			if err == nil {
				_ = n.Kill()
				t.Fatal("started; want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err)
			}
			if tc.name != "the API port in use" {
				// The API listener it opened is closed again.
				ln, err := net.Listen("tcp", cfg.APIAddr)
				if err != nil {
					t.Fatalf("the API port is still held after the failed start: %v", err)
				}
				ln.Close()
			}
		})
	}
}

// The Authorization scheme is case-insensitive: "bearer <token>" is the
// cluster token as "Bearer <token>" is, for mutations and for reads that
// show more to token holders. Before, only "Bearer " was recognised and
// "bearer" got 401.
func TestTokenSchemeIsCaseInsensitive(t *testing.T) {
	n := newHarness(t).start("a")
	send := func(method, path, auth string, body []byte, out any) int {
		t.Helper()
		req, _ := http.NewRequest(method, api(n, path), bytes.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if out != nil {
			_ = json.NewDecoder(resp.Body).Decode(out)
		}
		return resp.StatusCode
	}
	schemes := []string{"Bearer", "bearer", "BEARER", "bEaReR"}
	for i, scheme := range schemes {
		spec := []byte(fmt.Sprintf(`{"name":"chat%d","model":"m","replicas":0,"env":{"HF_TOKEN":"hf_secret"}}`, i))
		if code := send("POST", "/v1/deployments", scheme+" "+testToken, spec, nil); code != http.StatusOK {
			t.Errorf("%s: place got HTTP %d, want 200", scheme, code)
		}
	}
	// Reads show the last reconcile pass, which follows the places.
	testwait.Until(t, 10*time.Second, "the places in the read model", func() (bool, string) {
		var deps []status.DeploymentInfo
		send("GET", "/v1/deployments", "", nil, &deps)
		return len(deps) == len(schemes), fmt.Sprint(len(deps))
	})
	for _, scheme := range schemes {
		var deps []status.DeploymentInfo
		send("GET", "/v1/deployments", scheme+"  "+testToken, nil, &deps)
		if len(deps) == 0 || deps[0].Deployment.Env["HF_TOKEN"] != "hf_secret" {
			t.Errorf("%s: a token holder's read is redacted: %+v", scheme, deps)
		}
	}
	for auth, want := range map[string]int{
		"Basic " + testToken:        http.StatusUnauthorized,
		"Bearer":                    http.StatusUnauthorized,
		"Bearer ":                   http.StatusUnauthorized,
		"Bearer" + testToken:        http.StatusUnauthorized,
		"bearer wrong-token-xxxxxx": http.StatusForbidden,
	} {
		if code := send("DELETE", "/v1/deployments/chat0", auth, nil, nil); code != want {
			t.Errorf("%q: HTTP %d, want %d", auth, code, want)
		}
	}
}

// A client reads its own write back from the node that took it: right
// after a place (or an unplace) answers, that node's /v1/deployments and
// /v1/plan show it, though the read model is rebuilt by the control loop.
func TestWritesAreReadBackAtOnce(t *testing.T) {
	h := newHarness(t)
	n := h.start("a")
	for i := range 10 {
		spec := fmt.Sprintf(`{"name":"chat","model":"m/tiny","engine":"fake","args":["--round=%d"]}`, i)
		var placed status.DeploymentInfo
		if code := call(t, "POST", api(n, "/v1/deployments"), testToken, []byte(spec), &placed); code != 200 {
			t.Fatalf("round %d: place: HTTP %d", i, code)
		}
		var deps []status.DeploymentInfo
		call(t, "GET", api(n, "/v1/deployments"), "", nil, &deps)
		if len(deps) != 1 || deps[0].SpecVersion != placed.SpecVersion {
			t.Fatalf("round %d: right after the place, /v1/deployments shows %+v; want spec version %s", i, deps, placed.SpecVersion)
		}
		var p PlanInfo
		call(t, "GET", api(n, "/v1/plan"), "", nil, &p)
		if p.Deployments["chat"] != placed.SpecVersion {
			t.Fatalf("round %d: right after the place, the plan was computed from %v; want chat at %s", i, p.Deployments, placed.SpecVersion)
		}
	}
	if code := call(t, "DELETE", api(n, "/v1/deployments/chat"), testToken, nil, nil); code != 200 {
		t.Fatalf("unplace: HTTP %d", code)
	}
	var deps []status.DeploymentInfo
	call(t, "GET", api(n, "/v1/deployments"), "", nil, &deps)
	if len(deps) != 0 {
		t.Fatalf("right after the unplace, /v1/deployments shows %+v; want none", deps)
	}
}
