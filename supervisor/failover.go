package supervisor

import (
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/supervisor/engine"
)

// failovers marks the shards of mine that this node takes over from
// another node whose lease on them it judges lapsed (engine.Desired.
// Failover), so that the runner can trace the takeover from the lapse
// this node saw until its engine is ready.
//
// Only what is new here is looked at (not Kept: no lease of this node
// holds it yet), which is one pass or two per move; a pass that moves
// nothing costs a look at each of this node's assignments and allocates
// nothing.
func failovers(mine []engine.Desired, members []gossip.Member, self string, now time.Time, ttl time.Duration) {
	for i := range mine {
		if mine[i].Kept {
			continue
		}
		var best *engine.Failover
		var bestClaim int64
		for _, m := range members {
			if m.Name == self || m.Record == nil {
				continue
			}
			for _, s := range m.Record.Shards {
				if s.ShardID != mine[i].ShardID {
					continue
				}
				at, why, lapsed := holderLapse(m, now, ttl)
				// Of two lapsed holders (a partition healed, then both
				// went), the earlier claim is the one placement kept.
				if lapsed && (best == nil || s.ClaimStamp < bestClaim) {
					best, bestClaim = &engine.Failover{From: m.Name, At: at, Why: why}, s.ClaimStamp
				}
			}
		}
		mine[i].Failover = best
	}
}

// holderLapse says whether this node judges m's leases lapsed as a holder
// (BuildView's rule: not alive, leaving, of an earlier boot, or silent for
// longer than ttl), why, and since when by this node's clock: the best
// moment it knows of.
//
//   - silent: its last renewal seen plus ttl, the exact moment the
//     judgement turned (this node's own clock, never the holder's);
//   - dead or left: when memberlist told this node so (Member.Since), or
//     the lapse by silence when that came first;
//   - leaving: when the record saying so arrived;
//   - restarted (a record of an earlier boot): now, the pass that plans the
//     takeover; the gossip change that told it woke that pass at once.
//
// A shard whose holder still renews but stops it (ShardStopping lapses
// too, see JudgeLease) is a handover, not a failover, and is not one here.
func holderLapse(m gossip.Member, now time.Time, ttl time.Duration) (at time.Time, why string, lapsed bool) {
	alive := m.State == gossip.StateAlive || m.State == gossip.StateSuspect
	silentAt := m.SeenAt.Add(ttl)
	silent := now.Sub(m.SeenAt) > ttl
	current := m.Epoch == 0 || m.Record.Version.Epoch >= m.Epoch
	switch {
	case !alive && !m.Since.IsZero() && (!silent || m.Since.Before(silentAt)):
		at, why = m.Since, string(m.State)
	case silent:
		at, why = silentAt, "silent"
	case !alive:
		at, why = now, string(m.State)
	case m.Record.Leaving:
		at, why = m.SeenAt, "leaving"
	case !current:
		at, why = now, "restarted"
	default:
		return time.Time{}, "", false
	}
	if at.After(now) {
		at = now
	}
	return at, why, true
}
