package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/supervisor/profile"
	"github.com/llmgw/llmgw/supervisor/runtime"
	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// A gang is a replica that spans nodes: one engine per node, started with
// the engine's own multi-node flags. There is no leader. Rank 0's holder
// picks the rendezvous port and a generation and publishes both in its
// shard record (gossip.GangRecord); the other members start once their
// holders see it, naming them, and stop when it changes. The gang lives and
// dies together: rank 0's holder tears its engine down when a member
// crashes, stops, moves or is lost, and counts that as the gang's crash
// (backoff and "failing" are per gang, kept by rank 0's holder); a member
// tears its engine down when rank 0 does, which is not a crash of its own.
// Only rank 0 serves HTTP; the others are ready while they run and rank 0's
// record, at their generation, says it is ready.
//
// Here: what an engine knows of its gang (managed's isGang, isMember,
// memberReady, setGangNote); this node's part in a rendezvous and in the
// record (gangNode); when a gang is broken (gangBroken) and the teardown
// (Runner.checkGang); a member's stop, which is not a crash
// (restartPolicy.memberStopped).

// isMember reports whether e is a gang member above rank 0: it has no
// HTTP of its own, so its readiness comes from rank 0's record.
func (e *managed) isMember() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.desired.Gang != nil {
		return e.desired.Gang.Rank > 0
	}
	return e.state.Gang != nil && e.state.Gang.Rank > 0
}

// isGang reports whether the plan gave e a gang (or its state file says it
// was started in one).
func (e *managed) isGang() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.desired.Gang != nil || e.state.Gang != nil || e.desired.Spec.PipelineParallel > 1
}

func stopped(s gossip.ShardStatus) bool {
	return s == gossip.ShardCrashed || s == gossip.ShardBackoff || s == gossip.ShardStopping
}

// gangNode is this node as its gangs see it: its name (how rank 0 names
// its members), the address it advertises (where its rank 0 engines
// listen for their gang), and the ports a rendezvous is taken from.
type gangNode struct {
	name, host string
	clock      clock.Clock
	ports      *ports
}

// start says whether gang member e may start now and with which
// rendezvous, or, when it may not, what it waits for (the member's note).
// lastGen is the generation the member's engine last ran against (see
// watchState.lastGen). It takes e.mu.
func (n gangNode) start(e *managed, lastGen int64) (*shardstate.Gang, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	g := e.desired.Gang
	if g == nil {
		return nil, "waiting for the plan to place the rest of the gang"
	}
	nodes := make([]string, len(g.Peers))
	for j, p := range g.Peers {
		if p.Node == "" {
			return nil, fmt.Sprintf("waiting for rank %d to be placed", j)
		}
		nodes[j] = p.Node
	}
	if g.Rank == 0 {
		// A lost member would never connect: starting now would only be
		// torn down again when the plan moves it.
		for j, p := range g.Peers {
			if j > 0 && p.Lost {
				return nil, fmt.Sprintf("waiting for rank %d: its node %s is lost", j, p.Node)
			}
		}
		gen := n.clock.Now().UnixNano()
		prevPort := 0
		if prev := e.state.Gang; prev != nil {
			gen = max(gen, prev.Generation+1)
			prevPort = prev.MasterPort
		}
		port, err := n.ports.rendezvous(e.id, prevPort)
		if err != nil {
			return nil, "no free port for the rendezvous: " + err.Error()
		}
		return &shardstate.Gang{Rank: 0, Size: g.Size, Generation: gen, MasterAddr: n.host, MasterPort: port, Members: nodes}, ""
	}
	r0 := g.Peers[0]
	rv := r0.Gang
	switch {
	case r0.Lost:
		return nil, fmt.Sprintf("waiting for rank 0: its node %s is lost", r0.Node)
	case !r0.Held || rv.Generation == 0 || rv.Addr == "":
		return nil, fmt.Sprintf("waiting for rank 0's address (rank 0 on %s)", r0.Node)
	case rv.Generation == lastGen || stopped(r0.Status):
		return nil, fmt.Sprintf("waiting for rank 0 on %s to restart the gang", r0.Node)
	case len(rv.Members) != g.Size || rv.Members[g.Rank] != n.name:
		return nil, fmt.Sprintf("waiting for rank 0 on %s to name this node at rank %d", r0.Node, g.Rank)
	}
	host, p, err := net.SplitHostPort(rv.Addr)
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil {
		return nil, fmt.Sprintf("rank 0 on %s publishes an unusable address %q", r0.Node, rv.Addr)
	}
	return &shardstate.Gang{Rank: g.Rank, Size: g.Size, Generation: rv.Generation, MasterAddr: host, MasterPort: port,
		Members: slices.Clone(rv.Members)}, ""
}

// setGangNote records what holds e back (shown in its record).
func (e *managed) setGangNote(note string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gangNote != note {
		e.gangNote = note
		notify(e.changes)
	}
}

// gangMoveGrace is how long a rank must stay moved in the plan, its old
// holder not lost, before the gang is torn down for it. A holder whose
// agent restarts is judged lapsed by the cluster until its new record
// arrives (its older boot's record claims nothing), and a plan of that
// moment may move its rank elsewhere; the adopted engine's claim then wins
// it back. Tearing the gang down for that blink would restart every member
// for an agent restart. A lost holder tears the gang down at once.
const gangMoveGrace = time.Second

// gangTeardownGrace is what a broken gang's engine gets between SIGTERM and
// SIGKILL, far less than a draining engine's Grace: its requests in hand
// can never complete without the lost rank, and a rank hung on its peer
// (as vLLM's are) may not heed SIGTERM at all, so waiting would only delay
// the gang's re-forming.
const gangTeardownGrace = 500 * time.Millisecond

// gangBroken says why the gang e runs in (generation st) can no longer
// work, or "" while it can; moved says the reason is only a rank the plan
// moved (see gangMoveGrace).
func gangBroken(g *Gang, st *shardstate.Gang) (why string, moved bool) {
	if g == nil || st == nil || len(g.Peers) != st.Size || len(st.Members) != st.Size {
		return "", false
	}
	gone := func(node string) bool { return slices.Contains(g.LostNodes, node) }
	if g.Rank == 0 {
		for j := 1; j < len(g.Peers); j++ {
			p := g.Peers[j]
			switch {
			case gone(st.Members[j]) && p.Node != st.Members[j]:
				return fmt.Sprintf("rank %d on %s lost", j, st.Members[j]), false
			case p.Lost:
				return fmt.Sprintf("rank %d on %s lost", j, p.Node), false
			case p.Node != st.Members[j]:
				return fmt.Sprintf("rank %d moved from %s to %s", j, st.Members[j], orNone(p.Node)), true
			case p.Held && p.Gang.Generation == st.Generation && stopped(p.Status):
				return fmt.Sprintf("rank %d on %s %s", j, p.Node, p.Status), false
			}
		}
		return "", false
	}
	r0 := g.Peers[0]
	switch {
	case gone(st.Members[0]) && r0.Node != st.Members[0]:
		return fmt.Sprintf("rank 0 on %s lost", st.Members[0]), false
	case r0.Lost:
		return fmt.Sprintf("rank 0 on %s lost", r0.Node), false
	case r0.Node != st.Members[0]:
		return fmt.Sprintf("rank 0 moved from %s to %s", st.Members[0], orNone(r0.Node)), true
	case r0.Held && r0.Gang.Generation != 0 && r0.Gang.Generation != st.Generation:
		return fmt.Sprintf("rank 0 on %s restarted the gang", r0.Node), false
	case r0.Held && r0.Gang.Generation == st.Generation && stopped(r0.Status):
		return fmt.Sprintf("rank 0 on %s %s", r0.Node, r0.Status), false
	}
	return "", false
}

func orNone(n string) string {
	if n == "" {
		return "nowhere"
	}
	return n
}

// checkGang tears e down when its gang broke: rank 0 counts it as the
// gang's crash (so the gang backs off, and fails, as one); any other rank
// stops without counting it, and waits for rank 0's next generation. It
// runs on e's watch goroutine, which owns w, with no lock held.
func (r *Runner) checkGang(e *managed, w *watchState) {
	e.mu.Lock()
	g, st := e.desired.Gang, e.state.Gang
	e.mu.Unlock()
	why, moved := gangBroken(g, st)
	now := r.cfg.Clock.Now()
	if why == "" || !moved {
		w.movedSince = time.Time{}
	}
	if why == "" {
		return
	}
	if moved {
		if w.movedSince.IsZero() {
			w.movedSince = now
		}
		if now.Sub(w.movedSince) < gangMoveGrace {
			return
		}
	}
	w.movedSince = time.Time{}
	r.log.Warn("gang broken; stopping this member", "shard", e.state.ShardID, "why", why, "generation", st.Generation)
	if err := r.cfg.Runtime.Stop(context.Background(), e.id, min(r.cfg.Grace, gangTeardownGrace)); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		r.log.Error("stop gang member", "shard", e.state.ShardID, "err", err)
		return // still running: try again at the next poll
	}
	w.started = false
	w.trace.fail(now, why)
	if g.Rank == 0 {
		e.setGangNote(why + "; gang restarting")
		w.retryAt = r.policy.crashed(e, nil)
		return
	}
	r.policy.memberStopped(e, w, why+"; waiting for rank 0's next generation", nil)
}

// memberStopped records that the engine of gang member e (above rank 0)
// ended: torn down (code nil) or exited on its own. Neither counts as a
// crash here: the gang's crashes are counted by rank 0's holder, which
// tears the gang down when it sees this member stopped, and restarts it
// under a new generation; this member waits for that one. Its caller is
// e's watch goroutine, the owner of w.
func (p restartPolicy) memberStopped(e *managed, w *watchState, note string, code *int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state.Gang != nil {
		w.lastGen = e.state.Gang.Generation
	}
	e.ready, e.readySince = false, time.Time{}
	e.gangNote = note
	if e.status != gossip.ShardStopping {
		e.status = gossip.ShardStarting
		if code != nil {
			e.status = gossip.ShardCrashed
		}
	}
	if code != nil {
		e.state.Restarts++
		e.state.LastExitCode = code
		e.state.LastExitAt = p.clock.Now()
		_ = shardstate.Save(p.shards, e.state)
	}
	notify(e.changes)
}

// memberReady is a member's readiness: it has no HTTP, so it is ready
// while it runs and rank 0's record, at its generation, says ready (or
// said so, see below).
func (e *managed) memberReady() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	g, st := e.desired.Gang, e.state.Gang
	if g == nil && st != nil {
		// Adopted, and no plan yet (the agent has not settled): it ran
		// in its gang before the agent restarted; the first plan judges.
		return e.ready
	}
	if g == nil || st == nil || len(g.Peers) == 0 {
		return false
	}
	r0 := g.Peers[0]
	if !r0.Held || r0.Lost || r0.Gang.Generation != st.Generation {
		return false
	}
	// Once ready in this generation it stays so while rank 0 holds it: a
	// rank-0 agent that restarts reports its engine starting until its
	// probe passes, and a member that followed would make the gang
	// unroutable for that blink. The gateway judges rank 0's own
	// readiness anyway; a real failure changes the generation or tears the
	// member down.
	return r0.Ready || e.ready
}

// gangInputs are the profile inputs of a gang start.
func gangInputs(st *shardstate.Gang) *profile.GangInputs {
	if st == nil {
		return nil
	}
	return &profile.GangInputs{NNodes: st.Size, Rank: st.Rank, MasterAddr: st.MasterAddr, MasterPort: st.MasterPort}
}

// recordLocked is e's gang part of its record; the caller holds e.mu.
func (n gangNode) recordLocked(e *managed) *gossip.GangRecord {
	st := e.state.Gang
	var out gossip.GangRecord
	switch {
	case e.desired.Gang != nil:
		out.Rank, out.Size = e.desired.Gang.Rank, e.desired.Gang.Size
	case st != nil:
		out.Rank, out.Size = st.Rank, st.Size
	default:
		return nil
	}
	if st != nil && st.Rank == out.Rank && st.Size == out.Size {
		out.Generation = st.Generation
		if st.Rank == 0 {
			out.Addr = net.JoinHostPort(n.host, strconv.Itoa(st.MasterPort))
			out.Members = slices.Clone(st.Members)
		}
	}
	out.Note = Clip(e.gangNote, 290)
	return &out
}

// hostInterface is the advertised address as an IP and the name of the
// interface that carries it ("" when none does, or host is a name): a
// gang's collective traffic must go where its peers can reach it.
func hostInterface(host string) (ip, iface string) {
	addr := net.ParseIP(host)
	if addr == nil {
		return "", ""
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return addr.String(), ""
	}
	for _, i := range ifs {
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(addr) {
				return addr.String(), i.Name
			}
		}
	}
	return addr.String(), ""
}
