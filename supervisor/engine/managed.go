package engine

import (
	"context"
	"sync"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/probes/load"
	"github.com/llmgw/llmgw/supervisor/profile"
	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// managed is one shard's engine on this node, as the runner tracks it.
//
// id, stop, mu, changes and failover are set before it joins the runner's
// table (Runner.engines) and never change, so they are read without a
// lock.
// Every other field is guarded by mu: written only under it, and read
// under it, with one exception: the
// engine's own watch goroutine reads without it the fields that only it
// writes, crashes and state (all of state but Spec.Deployment, which
// Reconcile fills in), for its logs and its state file.
//
// The methods of managed take mu themselves, except those named …Locked,
// whose caller holds it.
type managed struct {
	id string
	// stop ends the engine's watch: the watcher then stops the engine and
	// forgets it (see finish).
	stop context.CancelFunc
	// mu is the runner's lock (Runner.mu), one for the runner's table and
	// every engine in it, so the node's record (Shards) reads all its
	// engines at one moment.
	mu *sync.Mutex
	// changes is the runner's Changes: a change of what e's record shows
	// is announced there (see notify).
	changes chan<- struct{}
	// failover is the takeover the plan started this engine for (the
	// Desired.Failover of the pass that made it), kept apart from
	// desired, which every pass overwrites: the next pass, in which this
	// node already holds the shard, may come before the watcher reads it.
	failover *Failover

	desired Desired
	state   shardstate.State
	status  gossip.ShardStatus
	ready   bool
	failing bool
	crashes int // crashes in a row since the engine last ran stably
	// readySince is when the current run became ready (zero: not ready);
	// StableAfter of it resets crashes.
	readySince time.Time
	// planned: the plan has given this engine its spec. An adopted
	// engine's state file holds only enough to watch it, so a crash
	// before the first plan waits for one instead of restarting it with a
	// partial command (an orphan is never planned, so never restarted).
	planned bool
	// portForeign: another process answers on the engine's port (logged
	// once per episode; see prober.ownsPort).
	portForeign bool
	// startErr is why the last start failed; cleared by a start that works.
	startErr string
	// gangNote says what holds a gang member back (see gang.go).
	gangNote string
	// note and noteAt say what the engine is doing while it does not
	// serve, or why it stopped (see gossip.ShardRecord.Note).
	note   string
	noteAt time.Time
	// took is how the last start that became ready here spent its time
	// (gossip.ShardRecord.PullMs, LoadMs); zero until one did.
	took startTook
	// registered is the LoRA adapters the engine's models list names
	// (name → root), from the last readiness probe; adapterErrs why the
	// registration of each failing adapter failed (lora.go).
	registered  map[string]string
	adapterErrs map[string]string
	// drain: it served when it was told to stop, so it keeps serving for
	// Config.DrainDelay first (see finish).
	drain bool
	// orphan: found running with our labels but no state file. Without
	// the file its port, GPUs and claim are unknown, so it is stopped once
	// the node settles (the plan then starts the shard afresh if wanted).
	orphan bool
	// prof is the engine's profile, resolved once (profile.Lookup builds
	// the whole table, and readiness asks for it every poll), and scraper
	// reads its /metrics by the profile's metric names.
	prof    *profile.Profile
	scraper *load.Scraper
	load    gossip.ShardLoad
	// scrapedAt is when load was last read.
	scrapedAt time.Time
	// missing are the profile's metrics its page lacked, each reported
	// once (missing.go); missingAt is when the first was seen.
	missing   []string
	missingAt time.Time
}

// notify signals the runner's Changes without waiting: one pending
// signal stands for any number of changes.
func notify(changes chan<- struct{}) {
	select {
	case changes <- struct{}{}:
	default:
	}
}

// isPlanned reports whether the plan has given e its spec (see
// managed.planned).
func (e *managed) isPlanned() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.planned
}

// isReady reports e's last readiness verdict.
func (e *managed) isReady() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ready
}

// profile returns the engine's profile. The spec version fixes the
// engine kind, so it is looked up once per engine. Adopted engines carry
// the kind from their state file (see track).
func (e *managed) profile() (profile.Profile, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.profileLocked()
}

func (e *managed) profileLocked() (profile.Profile, error) {
	if e.prof == nil {
		p, err := profile.Lookup(e.desired.Spec.Engine)
		if err != nil {
			return profile.Profile{}, err
		}
		e.prof = &p
	}
	return *e.prof, nil
}

// setNote records what e's engine is doing for its record, notifying only
// when the words change: at says when, so "loading, log grew 2s ago" needs
// no republication every poll (a move of at alone waits for the next
// record the engine's other changes send, or is sent when 15 s old).
// startTook is one start's phases: the image's pull, and from the
// engine's process start to its first ready answer (its load and its own
// warm-up, which every engine does before it answers ready).
type startTook struct {
	pull, load time.Duration
}

// setTook records how the start that just became ready spent its time.
func (e *managed) setTook(t startTook, ok bool) {
	if !ok {
		return // adopted: this agent did not see it start
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.took = t
	notify(e.changes)
}

func (e *managed) setNote(note string, at time.Time) {
	note = Clip(printableOnly(note), 300)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.note == note && (at.Sub(e.noteAt) < noteRefresh) {
		return
	}
	e.note, e.noteAt = note, at
	notify(e.changes)
}

// noteRefresh is how stale a note's moment may get in the record before it
// is republished (a phase change is published at once).
const noteRefresh = 15 * time.Second

// setStartErr records why e's last start failed (or why it was stopped as
// a crash), for its record.
func (e *managed) setStartErr(why string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.startErr = Clip(why, 300)
}

// startTimeout is e's deployment's start_timeout, or def (the runner's).
func (e *managed) startTimeout(def time.Duration) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.startTimeoutLocked(def)
}

// startTimeoutLocked is startTimeout with e.mu held.
func (e *managed) startTimeoutLocked(def time.Duration) time.Duration {
	if t := time.Duration(e.desired.Spec.StartTimeout); t > 0 {
		return t
	}
	return def
}

// gpuIndices are the GPUs e's engine runs on (from the plan, or from its
// state file for an adopted engine).
func (e *managed) gpuIndices() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.desired.GPUs) > 0 {
		return e.desired.GPUs
	}
	return e.state.Spec.GPUIndices
}
