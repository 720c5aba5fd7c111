package supervisor

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/supervisor/datadir"
)

// identity is this node's node.json: its name, its boot epoch, the peers
// it remembers and the cluster version it last saw active. Start loads
// it; after that two loops write it, each its own field: the join loop
// the peers, gossip the active version (when it rises).
type identity struct {
	dir datadir.Dir
	log *slog.Logger
	// mu guards id and orders the writes of node.json: each writes the
	// whole file, so one writer's older copy must not land after
	// another's newer one.
	mu sync.Mutex
	id datadir.Identity
}

// loadIdentity reads node.json, checks the name, and bumps the boot epoch
// so this run's records are newer than any the cluster still holds from the
// last run, even if the clock went backwards in between; now is the time
// of this start.
//
// A stored epoch beyond gossip.MaxClockOffset of now (the node once booted
// with its clock far ahead) starts over at now, with a log line: peers
// refuse epochs that far ahead, so they never took a record of it, and
// bumping it would keep the node out until the clocks caught up.
//
// Before anything is written it checks that no file in the data dir comes
// from an llmgw of a newer protocol (datadir.CheckProtocol): going back to
// an older binary must not overwrite what the newer one left.
func loadIdentity(dir datadir.Dir, name string, now time.Time, log *slog.Logger) (datadir.Identity, error) {
	if err := dir.CheckProtocol(); err != nil {
		return datadir.Identity{}, err
	}
	id, found, err := dir.ReadIdentity()
	switch {
	case errors.Is(err, datadir.ErrCorrupt):
		return id, fmt.Errorf("--data-dir: %v; move it aside to start as a new node", err)
	case err != nil:
		return id, fmt.Errorf("--data-dir: %w", err)
	case found && id.Name != "" && id.Name != name:
		return id, fmt.Errorf("--name %q: the data dir %s belongs to node %q; use that name or another --data-dir", name, dir.Root(), id.Name)
	}
	id.Name = name
	if limit := now.Add(gossip.MaxClockOffset).UnixNano(); id.Epoch > limit {
		log.Warn("the stored boot epoch lies in the future (this node once booted with its clock ahead); starting over at now, as peers refuse an epoch that far ahead",
			"stored_epoch", time.Unix(0, id.Epoch).UTC().Format(time.RFC3339), "now", now.UTC().Format(time.RFC3339), "bound", gossip.MaxClockOffset, "file", dir.NodeFile())
		id.Epoch = 0
	}
	id.Epoch = max(id.Epoch+1, now.UnixNano())
	if err := dir.WriteIdentity(id); err != nil {
		return id, fmt.Errorf("--data-dir: %w", err)
	}
	return id, nil
}

// rememberPeers saves the gossip addresses of the live members other than
// self, so a restart finds the cluster without --join.
func (i *identity) rememberPeers(self string, members []gossip.Member) {
	var peers []string
	for _, m := range members {
		if m.Name != self && m.State == gossip.StateAlive && m.Address != "" {
			peers = append(peers, m.Address)
		}
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if len(peers) == 0 || slices.Equal(i.id.Peers, peers) {
		return
	}
	i.id.Peers = peers
	if err := i.dir.WriteIdentity(i.id); err != nil {
		i.log.Warn("remember peers", "err", err)
	}
}

// saveActiveVersion keeps v, the cluster version that just became active,
// in node.json (atomically, with the rest of the file as it is), so the
// next start begins at it (datadir.Identity.ActiveVersion) instead of at
// the lowest version. The active version never goes down: a v at or below
// the one kept changes nothing.
func (i *identity) saveActiveVersion(v int) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if v <= i.id.ActiveVersion {
		return nil
	}
	next := i.id
	next.ActiveVersion = v
	if err := i.dir.WriteIdentity(next); err != nil {
		return fmt.Errorf("keep active cluster version %d: %w", v, err)
	}
	i.id = next
	return nil
}
