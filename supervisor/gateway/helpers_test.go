package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// Every test stops the servers, clients and gateways it started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

const ttl = 3 * time.Second

// world is a hand-made cluster: deployments, nodes, the shard copies they
// hold and the plan, turned into a status.Snapshot the way a reconcile
// pass does (status.Build).
type world struct {
	specs   map[string]placement.Deployment
	members map[string]*gossip.Member
	nodes   map[string]*placement.Node
	plan    placement.Plan
	seen    time.Time
	ttl     time.Duration
	// settling: the node's snapshots say it has not settled yet.
	settling bool
	// lastSeen, when it names a member, is when it was last heard (its
	// leases lapse a TTL after); others are heard at the snapshot's time.
	lastSeen map[string]time.Time
}

func newWorld() *world {
	return &world{specs: map[string]placement.Deployment{}, members: map[string]*gossip.Member{},
		nodes: map[string]*placement.Node{}, seen: t0, ttl: ttl}
}

// deploy adds a deployment (one replica unless it says otherwise).
func (w *world) deploy(d placement.Deployment) placement.Deployment {
	if d.Replicas == 0 {
		d.Replicas = 1
	}
	if d.Model == "" {
		d.Model = "org/" + d.Name
	}
	if d.Engine == "" {
		d.Engine = "fake"
	}
	d = d.WithDefaults()
	w.specs[d.Name] = d
	return d
}

// node adds a member in the given state, last seen at w.seen.
func (w *world) node(name string, state gossip.MemberState) {
	w.members[name] = &gossip.Member{Name: name, State: state, SeenAt: w.seen, Record: &gossip.NodeRecord{Name: name}}
	w.nodes[name] = &placement.Node{Name: name, Alive: state == gossip.StateAlive || state == gossip.StateSuspect}
}

// cp is one shard copy held by a node.
type cp struct {
	dep     string
	replica int
	shard   int    // the shard's index within a gang
	pp      int    // the gang size of this copy's spec (the deployment's when 0)
	spec    string // the current spec version when empty
	node    string
	lease   placement.LeaseState // valid when empty
	status  gossip.ShardStatus   // ready for a valid lease, else starting, when empty
	url     string
	private bool // the engine listens on its holder's loopback only
	drain   bool
	planned *bool // true when nil
	load    gossip.ShardLoad
	gang    *gossip.GangRecord
	// adapters are the LoRA adapters its engine lists.
	adapters []string
	// role is the replica's role in a disaggregated deployment, and
	// kvPort its KV transfer port.
	role   string
	kvPort int
}

func (w *world) hold(c cp) {
	d := w.specs[c.dep]
	if c.pp == 0 {
		c.pp = d.PipelineParallel
	}
	if c.spec == "" {
		c.spec = d.SpecVersion()
	}
	if c.lease == "" {
		c.lease = placement.LeaseValid
	}
	if c.status == "" {
		c.status = gossip.ShardStarting
		if c.lease == placement.LeaseValid {
			c.status = gossip.ShardReady
		}
	}
	rid := placement.RoleReplicaID(d.Name, c.role, c.replica)
	sid := placement.ShardID(rid, c.shard, c.pp)
	m := w.members[c.node]
	m.Record.Shards = append(m.Record.Shards, gossip.ShardRecord{ShardID: sid, ReplicaID: rid, Deployment: d.Name,
		SpecVersion: c.spec, Status: c.status, Ready: c.lease == placement.LeaseValid, URL: c.url, Private: c.private, Load: c.load, GPUs: []int{0}, Gang: c.gang,
		Adapters: c.adapters, Role: c.role, KVPort: c.kvPort})
	n := w.nodes[c.node]
	n.Shards = append(n.Shards, placement.HeldShard{ShardID: sid, SpecVersion: c.spec, Lease: c.lease})
	if c.planned == nil || *c.planned {
		w.plan.Assignments = append(w.plan.Assignments, placement.Assignment{ShardID: sid, ReplicaID: rid, Deployment: d.Name, Role: c.role,
			SpecVersion: c.spec, Node: c.node, GPUs: []int{0}, Draining: c.drain})
	}
}

func (w *world) unplaced(dep string, replica int, reason string) {
	rid := placement.ReplicaID(dep, replica)
	w.plan.Unplaced = append(w.plan.Unplaced, placement.Unplaced{ShardID: rid, ReplicaID: rid, Deployment: dep, Reason: reason})
}

func (w *world) snapshot() *status.Snapshot { return w.snapshotAt(t0) }

// snapshotAt builds n1's snapshot of a pass at now, every holder last
// seen then.
func (w *world) snapshotAt(now time.Time) *status.Snapshot { return w.snapshotOf("n1", now) }

// snapshotOf is snapshotAt as the node self sees it, once settled (w.settling
// says it has not heard the cluster yet).
func (w *world) snapshotOf(self string, now time.Time) *status.Snapshot {
	in := status.Input{Self: self, Now: now, TTL: w.ttl, Plan: w.plan, Settled: !w.settling}
	names := make([]string, 0, len(w.members))
	for n := range w.members {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		m := *w.members[n]
		m.SeenAt = now
		if at, ok := w.lastSeen[n]; ok {
			m.SeenAt = at
		}
		in.Members = append(in.Members, m)
		in.View.Nodes = append(in.View.Nodes, *w.nodes[n])
	}
	deps := make([]string, 0, len(w.specs))
	for n := range w.specs {
		deps = append(deps, n)
	}
	slices.Sort(deps)
	for i, n := range deps {
		d := w.specs[n]
		in.View.Deployments = append(in.View.Deployments, d)
		in.Deployments = append(in.Deployments, gossip.DeploymentRecord{Name: n, Spec: &d, Stamp: gossip.Stamp{Wall: t0.UnixMilli() + int64(i)}})
	}
	return status.Build(in)
}

func ptr[T any](v T) *T { return &v }

// upstream is an engine stand-in that counts what reaches it.
type upstream struct {
	*httptest.Server
	hits    atomic.Int64
	running atomic.Int64 // what /metrics reports
	mu      sync.Mutex
	bodies  [][]byte
	headers []http.Header
}

// newUpstream serves h on /v1/*; /metrics reports u.running requests
// running and none waiting.
func newUpstream(t *testing.T, h http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "vllm:num_requests_running %d\nvllm:num_requests_waiting 0\n", u.running.Load())
	})
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.bodies = append(u.bodies, b)
		u.headers = append(u.headers, r.Header.Clone())
		u.mu.Unlock()
		u.hits.Add(1)
		r.Body = io.NopCloser(bytes.NewReader(b))
		h(w, r)
	})
	u.Server = httptest.NewServer(mux)
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) lastBody() []byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.bodies) == 0 {
		return nil
	}
	return u.bodies[len(u.bodies)-1]
}

func (u *upstream) lastHeader() http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.headers) == 0 {
		return nil
	}
	return u.headers[len(u.headers)-1]
}

// chatOK answers a fixed chat completion naming the model it was asked.
func chatOK(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model string `json:"model"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, req.Model)
}

// status answers a fixed status with an OpenAI-shaped error.
func statusHandler(code int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"error":{"message":"engine says %d","type":"invalid_request_error","code":%d}}`, code, code)
	}
}

// harness is a gateway behind an httptest server, with a fake clock.
type harness struct {
	t     *testing.T
	gw    *Gateway
	srv   *httptest.Server
	clock *clock.Fake
}

func newHarness(t *testing.T, cfg Config, snap *status.Snapshot) *harness {
	t.Helper()
	h := &harness{t: t, clock: clock.NewFake(t0)}
	if cfg.Clock == nil {
		cfg.Clock = h.clock
	}
	h.gw = New(cfg)
	if snap != nil {
		h.gw.Update(snap)
	}
	h.srv = httptest.NewServer(h.gw)
	t.Cleanup(func() {
		h.srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := h.gw.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return h
}

type answer struct {
	status int
	header http.Header
	body   string
	// close: the answer said "Connection: close" (net/http's client takes
	// the header out and says so in Response.Close).
	close bool
}

// errorBody is OpenAI's error shape.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    string  `json:"code"`
		Param   *string `json:"param"`
	} `json:"error"`
}

func (a answer) apiError(t *testing.T) errorBody {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal([]byte(a.body), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code == "" {
		t.Fatalf("body %q is not an OpenAI error (%v)", a.body, err)
	}
	return e
}

func (h *harness) post(path, body string, hdr ...string) answer {
	h.t.Helper()
	return h.do(context.Background(), http.MethodPost, path, body, hdr...)
}

func (h *harness) do(ctx context.Context, method, path, body string, hdr ...string) answer {
	h.t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b), close: resp.Close}
}

func chatBody(model string, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"stream":%t,"messages":[{"role":"user","content":"hello there"}]}`, model, stream)
}

// oneDeployment is deployment "chat" with one ready replica per URL, on
// nodes n1, n2, ...
func oneDeployment(urls ...string) *world {
	w := newWorld()
	w.deploy(placement.Deployment{Name: "chat", Replicas: len(urls)})
	for i, u := range urls {
		n := fmt.Sprintf("n%d", i+1)
		w.node(n, gossip.StateAlive)
		w.hold(cp{dep: "chat", replica: i, node: n, url: u})
	}
	return w
}

// value sums what c collects (a counter or gauge, or one series of a vec).
func value(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	var sum float64
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		switch {
		case d.Counter != nil:
			sum += d.Counter.GetValue()
		case d.Gauge != nil:
			sum += d.Gauge.GetValue()
		case d.Histogram != nil:
			sum += float64(d.Histogram.GetSampleCount())
		}
	}
	return sum
}

// count is how many series c collects.
func count(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}
