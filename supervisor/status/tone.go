package status

import (
	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// Tone is what a node, shard or lease state means to whoever watches it:
// the one palette the cluster page, `llmgw top` and the node's overview
// colour states by. Each view maps the tones to its own colours once (a CSS
// class, a terminal style), so a state reads the same everywhere.
type Tone int

const (
	// ToneNone: not a state word; drawn plain.
	ToneNone Tone = iota
	// ToneOK: working as it should (alive, ready, valid).
	ToneOK
	// ToneWarn: on its way, or in doubt (suspect, starting, pending,
	// stopping; a member known only from a record).
	ToneWarn
	// ToneBad: failed, or no longer counts (dead, crashed, backoff,
	// lapsed, unplaced).
	ToneBad
	// ToneIdle: nothing there, and nothing wrong (a node that left, a
	// shard nobody holds).
	ToneIdle
)

// String is the tone's name.
func (t Tone) String() string {
	switch t {
	case ToneOK:
		return "ok"
	case ToneWarn:
		return "warn"
	case ToneBad:
		return "bad"
	case ToneIdle:
		return "idle"
	}
	return ""
}

// MemberTone is a member state's tone.
func MemberTone(s gossip.MemberState) Tone { return StateTone(string(s)) }

// ShardTone is a shard status's tone.
func ShardTone(s gossip.ShardStatus) Tone { return StateTone(string(s)) }

// LeaseTone is a lease's tone.
func LeaseTone(l placement.LeaseState) Tone { return StateTone(string(l)) }

// StateTone is the tone of a member state, shard status or lease as a word,
// for views that hold them as text (the overview reads peers and state
// files; `llmgw top` reads the API's JSON). The three sets of words share
// "starting", which means the same in both. Any other word is ToneNone.
func StateTone(word string) Tone {
	switch word {
	case string(gossip.StateAlive), string(gossip.ShardReady), string(placement.LeaseValid):
		return ToneOK
	case string(gossip.StateSuspect), string(gossip.StateUnknown),
		string(gossip.ShardStarting), string(gossip.ShardPending), string(gossip.ShardStopping):
		return ToneWarn
	case string(gossip.StateDead), string(gossip.StateRefused), string(gossip.ShardCrashed), string(gossip.ShardBackoff),
		string(gossip.ShardUnplaced), string(placement.LeaseLapsed):
		return ToneBad
	case string(gossip.StateLeft), string(LeaseNone):
		return ToneIdle
	}
	return ToneNone
}
