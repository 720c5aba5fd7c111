package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
)

// gangHarness runs one runner per node on this host (process runtime, the
// fake engine in gang mode) and plays the supervisor's part: every few
// milliseconds it gives each node the ranks the plan puts there, with the
// gang as that node would see it, built from the other runners' records
// (what gossip would carry).
type gangHarness struct {
	t    *testing.T
	spec placement.Deployment
	mu   sync.Mutex
	envs map[string]*runnerEnv
	run  map[string]*Runner
	// plan[j] is the node of rank j; lost marks nodes the cluster lost.
	plan []string
	lost map[string]bool
	// deaf marks nodes whose agent hears no plan (restarting, not yet
	// settled) but which the cluster has not lost.
	deaf map[string]bool
	stop chan struct{}
	done chan struct{}
	// mutate adjusts each node's runner config (another runtime).
	mutate func(node string, c *Config)
}

func newGangHarness(t *testing.T, pp int, nodes ...string) *gangHarness {
	return newGangHarnessWith(t, pp, "", func(string, *Config) {}, nodes...)
}

// newGangHarnessWith runs the gang's engines from image (none: the host's
// binary) through the runtime mutate puts in each node's config.
func newGangHarnessWith(t *testing.T, pp int, image string, mutate func(node string, c *Config), nodes ...string) *gangHarness {
	spec := placement.Deployment{Name: "big", Model: "m/big", Engine: "fake", Image: image, Replicas: 1, PipelineParallel: pp}.WithDefaults()
	h := &gangHarness{t: t, spec: spec, envs: map[string]*runnerEnv{}, run: map[string]*Runner{}, lost: map[string]bool{}, deaf: map[string]bool{},
		plan: slices.Clone(nodes[:pp]), stop: make(chan struct{}), done: make(chan struct{}), mutate: mutate}
	for _, n := range nodes {
		h.envs[n] = newRunnerEnv(t)
		h.run[n] = h.open(n)
	}
	go h.loop()
	t.Cleanup(func() {
		close(h.stop)
		<-h.done
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, r := range h.run {
			r.Reconcile(context.Background(), nil)
		}
		for n, r := range h.run {
			if r.base.Err() != nil {
				continue // reopened in the test, so closed by its own cleanup already; the runtime's cleanup stops its engines
			}
			waitShard(t, r, n+" stopped everything", func(s []string) bool { return len(s) == 0 })
			r.Close()
		}
	})
	return h
}

func (h *gangHarness) open(node string) *Runner {
	return h.envs[node].openWith(func(c *Config) { c.Node = node; h.mutate(node, c) })
}

func (h *gangHarness) shard(j int) string {
	return placement.ShardID("big-0", j, h.spec.PipelineParallel)
}

// record is rank j's shard record on node, as its runner reports it.
func (h *gangHarness) record(node string, j int) (gossip.ShardRecord, bool) {
	r := h.run[node]
	if r == nil {
		return gossip.ShardRecord{}, false
	}
	for _, s := range r.Shards() {
		if s.ShardID == h.shard(j) {
			return s, true
		}
	}
	return gossip.ShardRecord{}, false
}

func (h *gangHarness) pass() {
	h.mu.Lock()
	defer h.mu.Unlock()
	size := h.spec.PipelineParallel
	peers := make([]GangPeer, size)
	for j, node := range h.plan {
		p := GangPeer{Node: node, Lost: h.lost[node]}
		if s, ok := h.record(node, j); ok && !p.Lost {
			p.Held, p.Ready, p.Status = true, s.Ready, s.Status
			if s.Gang != nil {
				p.Gang = *s.Gang
			}
		}
		peers[j] = p
	}
	var lost []string
	for n, l := range h.lost {
		if l {
			lost = append(lost, n)
		}
	}
	for node, r := range h.run {
		var mine []Desired
		for j, n := range h.plan {
			if n != node || h.lost[node] {
				continue
			}
			mine = append(mine, Desired{Assignment: placement.Assignment{ShardID: h.shard(j), ReplicaID: "big-0", Deployment: "big",
				SpecVersion: h.spec.SpecVersion(), Node: node, GPUs: []int{0}}, Spec: h.spec,
				Gang: &Gang{Size: size, Rank: j, Peers: slices.Clone(peers), LostNodes: lost}})
		}
		if h.lost[node] || h.deaf[node] {
			continue // a lost or restarting node's agent acts on nothing; its engines keep running
		}
		r.Reconcile(context.Background(), mine)
	}
}

func (h *gangHarness) loop() {
	defer close(h.done)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		h.pass()
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
	}
}

// rec is rank j's record where the plan puts it now.
func (h *gangHarness) rec(j int) gossip.ShardRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, _ := h.record(h.plan[j], j)
	return s
}

func (h *gangHarness) describe() string {
	var out []string
	for j := range h.spec.PipelineParallel {
		s := h.rec(j)
		g := gossip.GangRecord{}
		if s.Gang != nil {
			g = *s.Gang
		}
		out = append(out, fmt.Sprintf("rank %d: %s ready=%v pid=%d restarts=%d gen=%d note=%q", j, s.Status, s.Ready, s.PID, s.Restarts, g.Generation, g.Note))
	}
	return strings.Join(out, "; ")
}

// waitServing waits until every rank is ready in one generation (other
// than not, when not is non-zero) and returns it.
func (h *gangHarness) waitServing(what string, not int64) int64 {
	h.t.Helper()
	var gen int64
	testwait.Until(h.t, 20*time.Second, what, func() (bool, string) {
		gen = 0
		for j := range h.spec.PipelineParallel {
			s := h.rec(j)
			if !s.Ready || s.Gang == nil || s.Gang.Generation == 0 || (gen != 0 && s.Gang.Generation != gen) {
				return false, h.describe()
			}
			gen = s.Gang.Generation
		}
		return gen != not, h.describe()
	})
	return gen
}

func (h *gangHarness) kill(pid int) {
	h.t.Helper()
	if pid <= 0 {
		h.t.Fatalf("no pid to kill")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		h.t.Fatal(err)
	}
}

// A pp 2 gang forms: rank 0 publishes its rendezvous, rank 1 starts
// against it with the engine's multi-node flags, and rank 0 is ready only
// once rank 1 has connected; only rank 0 has a URL.
func TestGangForms(t *testing.T) {
	h := newGangHarness(t, 2, "n1", "n2")
	gen := h.waitServing("the gang serving", 0)
	r0, r1 := h.rec(0), h.rec(1)
	if r0.URL == "" || r1.URL != "" {
		t.Errorf("URLs rank 0 %q, rank 1 %q: want only rank 0's", r0.URL, r1.URL)
	}
	if g := r0.Gang; g.Rank != 0 || g.Size != 2 || !strings.HasPrefix(g.Addr, "127.0.0.1:") || !slices.Equal(g.Members, []string{"n1", "n2"}) {
		t.Errorf("rank 0's gang record %+v", g)
	}
	if g := r1.Gang; g.Rank != 1 || g.Generation != gen || g.Addr != "" {
		t.Errorf("rank 1's gang record %+v", g)
	}
	states, _ := h.envs["n2"].dir.ReadShardStates()
	if len(states) != 1 || states[0].Gang == nil || states[0].Gang.Generation != gen {
		t.Fatalf("rank 1's state file %+v", states)
	}
	cmd := strings.Join(states[0].Spec.Command, " ")
	port := strings.TrimPrefix(r0.Gang.Addr, "127.0.0.1:")
	for _, want := range []string{"--nnodes=2", "--node-rank=1", "--master-addr=127.0.0.1", "--master-port=" + port, "--headless"} {
		if !strings.Contains(cmd, want) {
			t.Errorf("rank 1's command %q lacks %s", cmd, want)
		}
	}
}

// A member's engine crashes: every member stops and the gang starts again
// under a new generation. Rank 0's holder counts the gang's crash; the
// member's own crash count stays 0 (the gang's backoff is rank 0's).
func TestGangMemberCrashStopsEveryMember(t *testing.T) {
	h := newGangHarness(t, 2, "n1", "n2")
	gen := h.waitServing("the gang serving", 0)
	pid0 := h.rec(0).PID
	h.kill(h.rec(1).PID)
	gen2 := h.waitServing("the gang serving again", gen)
	if gen2 <= gen {
		t.Errorf("generation %d after %d: want a larger one", gen2, gen)
	}
	if h.rec(0).PID == pid0 {
		t.Errorf("rank 0's engine (pid %d) was not restarted with the gang", pid0)
	}
	if r := h.rec(0).Restarts; r < 1 {
		t.Errorf("rank 0's holder counts %d gang crashes, want at least 1", r)
	}
	h.mu.Lock()
	r2 := h.run["n2"]
	h.mu.Unlock()
	r2.mu.Lock()
	for _, e := range r2.engines {
		if e.crashes != 0 || e.failing {
			t.Errorf("member %s counts %d crashes of its own (failing %v); the gang's are rank 0's", e.id, e.crashes, e.failing)
		}
	}
	r2.mu.Unlock()
}

// Rank 0's engine crashes: the members are torn down too, and the gang
// starts again under a new generation.
func TestGangRank0CrashRestartsEveryMember(t *testing.T) {
	h := newGangHarness(t, 3, "n1", "n2", "n3")
	gen := h.waitServing("the gang serving", 0)
	pid1, pid2 := h.rec(1).PID, h.rec(2).PID
	h.kill(h.rec(0).PID)
	h.waitServing("the gang serving again", gen)
	if h.rec(1).PID == pid1 || h.rec(2).PID == pid2 {
		t.Errorf("members kept pids %d, %d across rank 0's crash; want every member restarted", pid1, pid2)
	}
}

// A member's node is lost while its engine keeps running (an engine that
// hangs rather than exits, as vLLM's do): rank 0's holder tears the gang
// down on its own, and the gang forms again where the plan moves the rank.
func TestGangLostMemberTearsTheGangDown(t *testing.T) {
	h := newGangHarness(t, 2, "n1", "n2", "n3")
	gen := h.waitServing("the gang serving", 0)
	pid0 := h.rec(0).PID
	h.mu.Lock()
	h.lost["n2"] = true
	h.mu.Unlock()
	testwait.Until(t, 10*time.Second, "rank 0 torn down", func() (bool, string) {
		s := h.rec(0)
		return s.PID != pid0 || !s.Ready, h.describe()
	})
	h.mu.Lock()
	h.plan[1] = "n3" // the plan moves rank 1 to a survivor
	h.mu.Unlock()
	// And when the plan moves the rank in the very pass that finds its
	// node lost (what a real plan does), the gang goes down at once, not
	// after the grace a move alone gets.
	gen1 := h.waitServing("the gang serving on n1 and n3", gen)
	pid0 = h.rec(0).PID
	h.mu.Lock()
	h.lost["n3"], h.plan[1] = true, "n2"
	h.lost["n2"] = false
	h.mu.Unlock()
	testwait.Until(t, gangMoveGrace/2, "rank 0 torn down at once", func() (bool, string) {
		s := h.rec(0)
		return s.PID != pid0 || !s.Ready, h.describe()
	})
	gen = gen1
	h.mu.Lock()
	h.lost["n3"], h.plan[1] = false, "n3"
	h.mu.Unlock()
	gen2 := h.waitServing("the gang serving on n1 and n3", gen)
	if g := h.rec(0).Gang; !slices.Equal(g.Members, []string{"n1", "n3"}) || gen2 <= gen {
		t.Errorf("rank 0's gang after the move %+v (generation was %d)", g, gen)
	}
}

// An agent restart on a member node restarts no member: the new runner
// adopts the engine with the generation from its state file, and nothing
// in the gang changes.
func TestGangAgentRestartOnAMemberRestartsNoMember(t *testing.T) {
	h := newGangHarness(t, 2, "n1", "n2")
	gen := h.waitServing("the gang serving", 0)
	pid0, pid1 := h.rec(0).PID, h.rec(1).PID
	h.mu.Lock()
	h.run["n2"].Close()
	h.run["n2"] = h.open("n2")
	h.mu.Unlock()
	untouched := func() (bool, string) {
		r0, r1 := h.rec(0), h.rec(1)
		ok := r0.PID == pid0 && r1.PID == pid1 && r0.Gang != nil && r0.Gang.Generation == gen
		return ok, h.describe()
	}
	testwait.StaysTrue(t, 2*time.Second, "the gang untouched by the agent restart", untouched)
	if got := h.waitServing("the member ready again", 0); got != gen {
		t.Errorf("generation %d after the agent restart, want %d", got, gen)
	}
	// The negative control: the member's engine dies instead, and the same
	// window sees the gang torn down.
	h.kill(pid1)
	testwait.BreaksWithin(t, 2*time.Second, "the gang torn down when the member's engine dies", untouched)
}

// A plan that moves a rank for a moment while its holder is not lost (an
// agent restarting is judged lapsed until its new record arrives) tears
// nothing down; a move that stays does, after gangMoveGrace, and the gang
// forms again where the plan put the rank.
func TestGangMoveBlinkTearsNothingDown(t *testing.T) {
	h := newGangHarness(t, 2, "n1", "n2", "n3")
	gen := h.waitServing("the gang serving", 0)
	pid0 := h.rec(0).PID
	h.mu.Lock()
	h.deaf["n2"], h.plan[1] = true, "n3"
	h.mu.Unlock()
	// The blink lasts until n3 has acted on it (it claims rank 1 and waits
	// for rank 0 to name it), well within the grace.
	testwait.Until(t, gangMoveGrace/2, "n3 acting on the blink", func() (bool, string) {
		h.mu.Lock()
		defer h.mu.Unlock()
		s, ok := h.record("n3", 1)
		return ok && s.Gang != nil && strings.Contains(s.Gang.Note, "to name this node"), fmt.Sprintf("%+v", s.Gang)
	})
	h.mu.Lock()
	h.deaf["n2"], h.plan[1] = false, "n2"
	h.mu.Unlock()
	untouched := func() (bool, string) {
		s := h.rec(0)
		return s.PID == pid0 && s.Gang != nil && s.Gang.Generation == gen, h.describe()
	}
	testwait.StaysTrue(t, 2*gangMoveGrace, "the gang untouched by the blink", untouched)
	h.mu.Lock()
	h.plan[1] = "n3"
	h.mu.Unlock()
	// The negative control: a move that stays is seen tearing the gang
	// down within the same window.
	testwait.BreaksWithin(t, 2*gangMoveGrace, "the gang torn down by a move that stays", untouched)
	gen2 := h.waitServing("the gang formed again on n1 and n3", gen)
	if g := h.rec(0).Gang; !slices.Equal(g.Members, []string{"n1", "n3"}) || gen2 <= gen {
		t.Errorf("rank 0's gang after the move %+v", g)
	}
}

// A gang's collective traffic is bound to the interface that carries the
// advertised address (loopback here); a name or an address no interface
// has gives no interface, and the engine's own default stands.
func TestHostInterface(t *testing.T) {
	if ip, iface := hostInterface("127.0.0.1"); ip != "127.0.0.1" || iface == "" {
		t.Errorf("127.0.0.1: %q on %q, want loopback's interface", ip, iface)
	}
	if ip, iface := hostInterface("192.0.2.77"); ip != "192.0.2.77" || iface != "" {
		t.Errorf("an address no interface has: %q on %q", ip, iface)
	}
	if ip, iface := hostInterface("gpu-1.example"); ip != "" || iface != "" {
		t.Errorf("a host name: %q on %q", ip, iface)
	}
}
