package engine

import (
	"context"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/probes/load"
	"github.com/llmgw/llmgw/supervisor/profile"
	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// managed is one shard's engine on this node, as the runner tracks it.
//
// id and stop are set when it is created and never change, so they are
// read without a lock. Every other field is guarded by Runner.mu: written
// only under it, and read under it, with one exception: the engine's own
// watch goroutine reads without it the fields that only it writes, crashes
// and state (all of state but Spec.Deployment, which Reconcile fills in),
// for its logs and its state file.
type managed struct {
	id string
	// stop ends the engine's watch: the watcher then stops the engine and
	// forgets it (see finish).
	stop context.CancelFunc

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
	// once per episode; see ownsPort).
	portForeign bool
	// startErr is why the last start failed; cleared by a start that works.
	startErr string
	// gangNote says what holds a gang member back (see gang.go).
	gangNote string
	// note and noteAt say what the engine is doing while it does not
	// serve, or why it stopped (see gossip.ShardRecord.Note).
	note   string
	noteAt time.Time
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
}

// isPlanned reports whether the plan has given e its spec (see
// managed.planned).
func (r *Runner) isPlanned(e *managed) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return e.planned
}

// profileOf returns the engine's profile. The spec version fixes the
// engine kind, so it is looked up once per engine. Adopted engines carry the
// kind from their state file (see track).
func (r *Runner) profileOf(e *managed) (profile.Profile, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.prof == nil {
		p, err := profile.Lookup(e.desired.Spec.Engine)
		if err != nil {
			return profile.Profile{}, err
		}
		e.prof = &p
	}
	return *e.prof, nil
}
