// Package scaletest runs many full llmgw nodes in one process and measures
// what a node costs as the cluster grows: `make scale` runs it from 25 to
// 500 nodes, and `make test` runs 25 against the budgets.
//
// Each node is the real thing but its engines: memberlist on loopback
// sockets, the control loop, the HTTP API, simulated GPUs, and shards
// claimed without running anything (as `--runtime none`). One Go runtime
// stands for hundreds of processes, so the CPU and memory a node costs
// are the process's divided by the nodes: the garbage collector and the
// scheduler are shared, which makes a node cheaper here than alone, and
// every figure is meant for how it grows with N, not as a host's figure
// (scenarios/idle-cpu.sh measures separate processes).
package scaletest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/freeport"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/supervisor"
	"github.com/llmgw/llmgw/supervisor/status"
)

// Options says what to run.
type Options struct {
	// Nodes is the cluster's size.
	Nodes int
	// Dir holds the nodes' data dirs.
	Dir string
	// Idle is how long the placed, idle cluster is measured (default 20 s).
	Idle time.Duration
	// Profile is the gossip profile (default "lan", memberlist's LAN
	// settings, what a real cluster runs).
	Profile string
	// LeaseTTL is every node's lease TTL (default 10 s, the agent's).
	LeaseTTL time.Duration
	// Wait bounds each wait for the cluster (default 3 minutes).
	Wait time.Duration
	// Progress, when set, is told what the run is doing.
	Progress func(format string, args ...any)
}

// Result is what one run measured. Times are wall time on this machine;
// per-node figures are the process's divided by Nodes.
type Result struct {
	Nodes int
	// Deployments placed before the idle window (Nodes/4, rounded up, of
	// 8 replicas at TP 2 on 8 GPUs a node: half the cluster's GPUs), and
	// the shards they hold.
	Deployments, Shards int
	// Started is how long starting every node took, one after another
	// (each joins three seeds).
	Started time.Duration
	// Members is the time after the last node started until every node
	// lists every member alive.
	Members time.Duration
	// Settled is the time after the deployments were placed until every
	// node computes the same plan with every shard placed and node 0 sees
	// every lease valid.
	Settled time.Duration
	// CPU is the process's CPU over the idle window per node, as a share
	// of one core (0.01 is 1 %).
	CPU float64
	// InByWay is BytesIn by way (gossip, direct, push_pull). A window
	// shorter than memberlist's push/pull interval may see none: PushPull
	// is what push/pull costs a node on average, each way, computed from
	// the state's size (each node starts one exchange per interval and is
	// picked for another: two whole states in and two out).
	InByWay  map[string]float64
	PushPull float64
	// RecordsIn is the records a node received per second by kind (node,
	// beat, deployment), copies dropped unread not counted: what the bytes
	// are made of.
	RecordsIn map[string]float64
	// BytesIn and BytesOut are gossip bytes a node received and sent per
	// second over the idle window, every way together (memberlist's own
	// probes and headers not counted: llmgw's messages, push/pull and
	// records).
	BytesIn, BytesOut float64
	// Passes and Plans are the reconcile passes a node ran, and the plans
	// it computed among them, per second over the idle window.
	Passes, Plans float64
	// PassTook is the median over nodes of their last pass's duration.
	PassTook time.Duration
	// HeapPerNode is the live heap after the idle window per node, bytes.
	HeapPerNode uint64
	// Agreed is the time after one more deployment was placed (at node
	// 0) until every node computes the same plan with all of it placed.
	Agreed time.Duration
	// DeathAgreed is the time after a node holding shards was killed
	// until every survivor computes the same plan with none on it and as
	// many shards placed as before.
	DeathAgreed time.Duration
}

// cluster is the running nodes.
type cluster struct {
	o     Options
	nodes []*supervisor.Node
	dead  map[int]bool
	// prints remembers each node's last snapshot and its plan's
	// fingerprint: a snapshot is immutable, so it is hashed once.
	prints []planPrint
}

type planPrint struct {
	snap *status.Snapshot
	sum  uint64
	// count is the plan's assignments, holders the nodes they name.
	count   int
	holders map[string]bool
}

// Run starts o.Nodes nodes, measures them and kills them. An error says
// which wait ran out; the Result holds what was measured until then.
func Run(ctx context.Context, o Options) (Result, error) {
	if o.Nodes < 2 {
		return Result{}, fmt.Errorf("nodes: %d: run at least 2", o.Nodes)
	}
	o.Idle = cmp.Or(o.Idle, 20*time.Second)
	o.LeaseTTL = cmp.Or(o.LeaseTTL, 10*time.Second)
	o.Wait = cmp.Or(o.Wait, 3*time.Minute)
	if o.Profile == "" {
		o.Profile = "lan"
	}
	if o.Progress == nil {
		o.Progress = func(string, ...any) {}
	}
	c := &cluster{o: o, dead: map[int]bool{}, prints: make([]planPrint, o.Nodes)}
	defer c.kill()
	res := Result{Nodes: o.Nodes, Deployments: (o.Nodes + 3) / 4}
	res.Shards = res.Deployments * 8

	start := time.Now()
	if err := c.start(ctx); err != nil {
		return res, err
	}
	res.Started = time.Since(start)
	o.Progress("%d nodes started in %v", o.Nodes, res.Started.Round(time.Millisecond))
	var err error
	if res.Members, err = c.waitFor(ctx, "every node lists every member alive", c.allMembers); err != nil {
		return res, err
	}
	o.Progress("members agree after %v", res.Members.Round(time.Millisecond))

	start = time.Now()
	for k := range res.Deployments {
		if err := c.place(ctx, fmt.Sprintf("dep%d", k)); err != nil {
			return res, err
		}
	}
	if _, err = c.waitFor(ctx, "every node plans every shard", func() bool { return c.agreed(res.Shards, "") }); err != nil {
		return res, err
	}
	if _, err = c.waitFor(ctx, "node 0 sees every lease valid", func() bool { return c.allValid(res.Shards) }); err != nil {
		return res, err
	}
	res.Settled = time.Since(start)
	o.Progress("%d shards placed and valid after %v", res.Shards, res.Settled.Round(time.Millisecond))

	// Let what the settling stirred up (load publications, push/pulls)
	// pass before the window.
	if err := pause(ctx, 5*time.Second); err != nil {
		return res, err
	}
	if err := c.measureIdle(ctx, &res); err != nil {
		return res, err
	}
	o.Progress("idle: %.2f%% of a core per node, %.0f B/s in (%v), %.0f B/s out, push/pull %.0f B/s each way, records in %v a second, %.2f passes/s", res.CPU*100, res.BytesIn, res.InByWay, res.BytesOut, res.PushPull, res.RecordsIn, res.Passes)

	start = time.Now()
	if err := c.place(ctx, "extra"); err != nil {
		return res, err
	}
	if res.Agreed, err = c.waitFor(ctx, "every node plans the new deployment", func() bool { return c.agreed(res.Shards+8, "") }); err != nil {
		return res, err
	}
	res.Agreed = time.Since(start)
	o.Progress("a place agreed after %v", res.Agreed.Round(time.Millisecond))

	victim := c.holder()
	name := c.nodes[victim].Name()
	start = time.Now()
	c.dead[victim] = true
	if err := c.nodes[victim].Kill(); err != nil {
		return res, fmt.Errorf("kill %s: %w", name, err)
	}
	if res.DeathAgreed, err = c.waitFor(ctx, "every survivor re-plans "+name+"'s shards", func() bool { return c.agreed(res.Shards+8, name) }); err != nil {
		return res, err
	}
	res.DeathAgreed = time.Since(start) // from the kill, which takes a while itself
	o.Progress("%s's death agreed after %v", name, res.DeathAgreed.Round(time.Millisecond))
	return res, nil
}

// start starts the nodes one after another; node i joins nodes 0 to 2.
func (c *cluster) start(ctx context.Context) error {
	prof, err := gossip.ProfileByName(c.o.Profile)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var seeds []string
	for i := range c.o.Nodes {
		name := "n" + strconv.Itoa(i)
		sim, err := gpu.NewSimulated("8xH100-80GB", name)
		if err != nil {
			return err
		}
		cfg := supervisor.Config{
			Name: name, DataDir: filepath.Join(c.o.Dir, name), BindAddr: "127.0.0.1", APIAddr: "127.0.0.1:0",
			Join: slices.Clone(seeds), Token: "scaletest-token-0123456789abcdef", Profile: prof,
			GPUs: sim, GPUsSimulated: true, LeaseTTL: c.o.LeaseTTL, Version: "scaletest", Logger: quiet,
		}
		var n *supervisor.Node
		// Another process may take a port between its pick and the bind.
		for try := 0; ; try++ {
			if cfg.BindPort, err = freeport.Loopback(); err != nil {
				return err
			}
			n, err = supervisor.Start(ctx, cfg)
			if err == nil || try == 3 {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		c.nodes = append(c.nodes, n)
		if len(seeds) < 3 {
			seeds = append(seeds, n.GossipAddr())
		}
	}
	return nil
}

// kill stops every node still running, without leaving (as a crash).
func (c *cluster) kill() {
	for i, n := range c.nodes {
		if !c.dead[i] {
			_ = n.Kill()
		}
	}
}

// waitFor polls cond until it holds and says how long that took.
func (c *cluster) waitFor(ctx context.Context, what string, cond func() bool) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(c.o.Wait)
	tick := time.NewTicker(100 * time.Millisecond) // real time: the harness measures wall time
	defer tick.Stop()
	report := start.Add(15 * time.Second)
	for !cond() {
		if now := time.Now(); now.After(report) {
			report = now.Add(15 * time.Second)
			c.o.Progress("waiting %v until %s: %s", now.Sub(start).Round(time.Second), what, c.state())
		}
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("%d nodes: %s: not within %v", c.o.Nodes, what, c.o.Wait)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-tick.C:
		}
	}
	return time.Since(start), nil
}

func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d) // real time: a measuring window, not a wait for an event
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// place places 8 replicas at TP 2 of the fake engine, as an operator's
// `llmgw place` at node 0 would (the API calls Place).
func (c *cluster) place(ctx context.Context, name string) error {
	_, err := c.nodes[0].Place(ctx, placement.Deployment{Name: name, Model: "m/tiny", Engine: "fake", Replicas: 8, TensorParallel: 2})
	if err != nil {
		return fmt.Errorf("place %s: %w", name, err)
	}
	return nil
}

// allMembers: every live node lists every live node alive.
func (c *cluster) allMembers() bool {
	want := c.o.Nodes - len(c.dead)
	// memberlist's count first: it is cheap, and the poll must not cost
	// the nodes it waits for (N nodes' members are N² entries).
	for i, n := range c.nodes {
		if !c.dead[i] && n.Cluster().NumMembers() != want {
			return false
		}
	}
	for i, n := range c.nodes {
		if c.dead[i] {
			continue
		}
		alive := 0
		for _, m := range n.Cluster().Members() {
			if m.State == gossip.StateAlive {
				alive++
			}
		}
		if alive != want {
			return false
		}
	}
	return true
}

// agreed: every live node's plan is the same, places shards assignments
// and puts none on the node named gone.
func (c *cluster) agreed(shards int, gone string) bool {
	var first uint64
	seen := false
	for i, n := range c.nodes {
		if c.dead[i] {
			continue
		}
		snap := n.Status()
		p := &c.prints[i]
		if p.snap != snap {
			plan := snap.Plan()
			p.snap, p.sum, p.count, p.holders = snap, fingerprint(plan), len(plan.Assignments), map[string]bool{}
			for _, a := range plan.Assignments {
				p.holders[a.Node] = true
			}
		}
		if p.count != shards || p.holders[gone] || seen && p.sum != first {
			return false
		}
		first, seen = p.sum, true
	}
	return seen
}

// state says where the nodes stand, for a wait that takes long: how
// many distinct plans they compute, of how many assignments, and the
// leases node 0 sees by state.
func (c *cluster) state() string {
	plans := map[uint64]int{}
	counts := map[int]int{}
	for i := range c.nodes {
		if !c.dead[i] && c.prints[i].snap != nil {
			plans[c.prints[i].sum]++
			counts[c.prints[i].count]++
		}
	}
	states := map[gossip.MemberState]int{}
	for _, m := range c.nodes[0].Cluster().Members() {
		states[m.State]++
	}
	leases := map[string]int{}
	n0 := c.nodes[0]
	for _, s := range n0.Status().Shards(n0.Now()) {
		leases[string(s.Lease)]++
	}
	return fmt.Sprintf("%d distinct plans, nodes by assignments %v, node 0's members %v and leases %v", len(plans), counts, states, leases)
}

// fingerprint hashes what placement decided: each shard's node, spec
// version and GPUs (assignments come sorted by shard ID).
func fingerprint(p placement.Plan) uint64 {
	h := fnv.New64a()
	for _, a := range p.Assignments {
		io.WriteString(h, a.ShardID+"\x00"+a.Node+"\x00"+a.SpecVersion+"\x00")
		for _, g := range a.GPUs {
			io.WriteString(h, strconv.Itoa(g)+",")
		}
	}
	return h.Sum64()
}

// allValid: node 0 judges n shards' leases valid.
func (c *cluster) allValid(n int) bool {
	valid := 0
	n0 := c.nodes[0]
	for _, s := range n0.Status().Shards(n0.Now()) {
		if s.Lease == placement.LeaseValid {
			valid++
		}
	}
	return valid >= n
}

// holder is a node other than 0 that holds shards.
func (c *cluster) holder() int {
	plan := c.nodes[0].Status().Plan()
	for i := len(c.nodes) - 1; i > 0; i-- {
		for _, a := range plan.Assignments {
			if a.Node == c.nodes[i].Name() {
				return i
			}
		}
	}
	return len(c.nodes) - 1
}

// measureIdle fills the idle figures over the window o.Idle.
func (c *cluster) measureIdle(ctx context.Context, res *Result) error {
	type count struct {
		cpu           time.Duration
		in, out       uint64
		ways, kinds   map[string]uint64
		passes, plans uint64
	}
	read := func() count {
		var k count
		k.cpu = processCPU()
		k.ways, k.kinds = map[string]uint64{}, map[string]uint64{}
		for _, n := range c.nodes {
			t := n.GossipStats().Traffic
			for kind, r := range t.RecordsIn {
				k.kinds[kind] += r
			}
			for way, b := range t.BytesIn {
				k.in += b
				k.ways[way] += b
			}
			for _, b := range t.BytesOut {
				k.out += b
			}
			passes, plans := n.Status().Plans()
			k.passes += passes
			k.plans += plans
		}
		return k
	}
	before, start := read(), time.Now()
	if err := pause(ctx, c.o.Idle); err != nil {
		return err
	}
	after, took := read(), time.Since(start)
	per := float64(c.o.Nodes) * took.Seconds()
	res.CPU = float64(after.cpu-before.cpu) / float64(time.Second) / per
	res.BytesIn = float64(after.in-before.in) / per
	res.BytesOut = float64(after.out-before.out) / per
	res.InByWay = map[string]float64{}
	for way, b := range after.ways {
		res.InByWay[way] = float64(b-before.ways[way]) / per
	}
	res.RecordsIn = map[string]float64{}
	for kind, r := range after.kinds {
		res.RecordsIn[kind] = math.Round(float64(r-before.kinds[kind])/per*100) / 100
	}
	res.Passes = float64(after.passes-before.passes) / per
	res.Plans = float64(after.plans-before.plans) / per
	prof, err := gossip.ProfileByName(c.o.Profile)
	if err != nil {
		return err
	}
	res.PushPull = 2 * float64(c.nodes[0].Cluster().StateBytes()) / prof.PushPullEvery(c.o.Nodes).Seconds()
	var took2 []time.Duration
	for _, n := range c.nodes {
		took2 = append(took2, n.Status().ReconcileTook())
	}
	slices.Sort(took2)
	res.PassTook = took2[len(took2)/2]
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	res.HeapPerNode = ms.HeapAlloc / uint64(c.o.Nodes)
	return nil
}

// processCPU is the user and system CPU this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Header and Row print results as a Markdown table.
const Header = "| nodes | start all | all members seen | placed and valid | idle CPU per node | gossip in, out per node | push/pull per node | passes, plans per node per s | pass | heap per node | place → same plan | death → same plan |\n|---|---|---|---|---|---|---|---|---|---|---|---|"

// Row is r as a line of Header's table; a run that stopped early (err)
// says so in the first column it has no figure for, and has dashes after.
func (r Result) Row(err error) string {
	if err != nil {
		cells := []string{strconv.Itoa(r.Nodes), secs(r.Started), secs(r.Members), secs(r.Settled)}
		for i := range cells[1:] {
			if cells[i+1] == "–" {
				cells[i+1] = "not within the wait"
				cells = cells[:i+2]
				break
			}
		}
		for len(cells) < 12 {
			cells = append(cells, "–")
		}
		return "| " + strings.Join(cells, " | ") + " |"
	}
	kb := func(b float64) string { return strconv.FormatFloat(b/1000, 'f', 1, 64) }
	d := secs
	return fmt.Sprintf("| %d | %s | %s | %s | %.2f %% | %s, %s KB/s | %s KB/s | %.2f, %.3f | %.2f ms | %.1f MB | %s | %s |",
		r.Nodes, d(r.Started), d(r.Members), d(r.Settled), r.CPU*100, kb(r.BytesIn), kb(r.BytesOut), kb(r.PushPull),
		r.Passes, r.Plans, float64(r.PassTook.Microseconds())/1000, float64(r.HeapPerNode)/1e6, d(r.Agreed), d(r.DeathAgreed))
}

// secs is t in seconds, or a dash for none.
func secs(t time.Duration) string {
	if t == 0 {
		return "–"
	}
	return strconv.FormatFloat(t.Seconds(), 'f', 2, 64) + " s"
}

// Issue 26's budgets for a node of a 500-node cluster.
const (
	// BudgetCPU is a node's idle CPU, as a share of one core.
	BudgetCPU = 0.02
	// BudgetBytes is a node's idle gossip per second, each way.
	BudgetBytes = 20_000.0
	// BudgetMembers is how soon after a start every node sees every
	// member; BudgetAgreed how soon after a place every node computes
	// the same plan with it.
	BudgetMembers = 10 * time.Second
	BudgetAgreed  = 5 * time.Second
)

// Missed lists the budgets r misses.
func (r Result) Missed() error {
	var errs []error
	if r.CPU > BudgetCPU {
		errs = append(errs, fmt.Errorf("idle CPU per node %.2f %% of a core, budget %.0f %%", r.CPU*100, BudgetCPU*100))
	}
	if b := math.Max(r.BytesIn, r.BytesOut) + r.PushPull; b > BudgetBytes {
		errs = append(errs, fmt.Errorf("gossip per node %.0f B/s with push/pull, budget %.0f", b, BudgetBytes))
	}
	if r.Members > BudgetMembers {
		errs = append(errs, fmt.Errorf("every member seen after %v, budget %v", r.Members, BudgetMembers))
	}
	if r.Agreed > BudgetAgreed {
		errs = append(errs, fmt.Errorf("a place agreed after %v, budget %v", r.Agreed, BudgetAgreed))
	}
	return errors.Join(errs...)
}
