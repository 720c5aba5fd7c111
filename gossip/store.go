package gossip

import (
	"bytes"
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/protocol"
)

// Store is one node's copy of the replicated state. Its merge operations
// are idempotent, commutative and associative for a given active protocol
// version: whatever order records arrive in, two stores that saw the same
// records hold the same state.
//
// Beside each record it keeps the bytes the record travels in (see
// nodeEntry.raw), and every copy it sends on is those bytes: a field that a
// later release added, which this build does not decode, survives this
// node's hop.
type Store struct {
	mu    sync.Mutex
	clock clock.Clock
	// active is the cluster's active protocol version: it picks the
	// tie-break between deployment records of equal stamps. It is called
	// before mu is taken, never under it: the cluster takes its own lock
	// before the store's (Members).
	active func() int
	nodes  map[string]*nodeEntry
	deps   map[string]depEntry
	// tombstoneTTL is how long a deletion is remembered. It must outlast any
	// node's downtime, or a node returning with the deployment in its data
	// dir would resurrect it.
	tombstoneTTL time.Duration
}

type nodeEntry struct {
	rec NodeRecord
	// content is the version whose content rec holds; rec.Version may be
	// newer through beats.
	content Version
	// raw is the record as it travels: the bytes it arrived in, or those
	// its writer encoded; rawVersion is the Version written in them.
	//
	// A beat advances rec.Version without content, so raw then says an
	// older version than rec. raw is not rewritten for it: that would mean
	// decoding and re-encoding it, which drops the fields this build does
	// not know. The version travels beside it instead: full sends, after
	// the raw record, a beat from rawVersion's content to rec.Version,
	// which every receiver (agents before this release too) merges after
	// the records of the same message, as it would the owner's beat.
	raw        json.RawMessage
	rawVersion Version
	// seenAt is this node's clock when it last accepted a newer version of
	// the record: the start of every lease's TTL on this receiver.
	seenAt time.Time
}

// depEntry is a deployment record and the bytes it travels in (as
// nodeEntry.raw; deployment records have no beats).
type depEntry struct {
	rec DeploymentRecord
	raw json.RawMessage
}

// message is a message carrying d alone, in its bytes.
func (d depEntry) message() message {
	return message{Deployments: []DeploymentRecord{d.rec}, depRaw: []json.RawMessage{d.raw}}
}

// NewStore returns an empty store judging time by clk, whose equal-stamp
// deployment records are ordered by the rule of the protocol version
// active returns (nil: this build's highest).
func NewStore(clk clock.Clock, tombstoneTTL time.Duration, active func() int) *Store {
	if active == nil {
		active = func() int { return protocol.Max }
	}
	return &Store{clock: clk, active: active, nodes: map[string]*nodeEntry{}, deps: map[string]depEntry{}, tombstoneTTL: tombstoneTTL}
}

// rawOf encodes a record written on this node: it travels in these bytes.
// A record that does not encode (a NaN in a float field) keeps none, and
// every send then tries to encode it again and says why it fails.
func rawOf(r any) json.RawMessage {
	b, err := json.Marshal(r)
	if err != nil {
		return nil
	}
	return b
}

// MergeNode keeps r if it is newer than what the store holds. It reports
// whether anything changed. r travels on encoded as this build encodes it:
// use mergeNode for a record that arrived in bytes of its own.
func (s *Store) MergeNode(r NodeRecord) bool { return s.mergeNode(r, nil) }

// mergeNode is MergeNode for a record that arrived as raw (nil: encode
// it).
func (s *Store) mergeNode(r NodeRecord, raw json.RawMessage) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.nodes[r.Name]
	if ok && !r.Version.Newer(e.rec.Version) {
		// Same version, or an older one: a beat may have advanced our
		// version past this content already, which is fine as content is
		// unchanged since e.content.
		return false
	}
	content := r.Content
	if content == (Version{}) || content.Newer(r.Version) {
		content = r.Version
	}
	if raw == nil {
		raw = rawOf(r)
	}
	r.Content = content
	s.nodes[r.Name] = &nodeEntry{rec: r, content: content, raw: raw, rawVersion: r.Version, seenAt: s.clock.Now()}
	return true
}

// MergeBeat applies a renewal. It reports whether it was accepted; a beat
// for content the store does not have is ignored until the full record
// arrives.
func (s *Store) MergeBeat(b Beat) bool {
	ok, _ := s.mergeBeat(b)
	return ok
}

// mergeBeat is MergeBeat that also says how long before this beat the
// record was last renewed (its previous seenAt).
func (s *Store) mergeBeat(b Beat) (bool, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.nodes[b.Name]
	if !ok || !b.Version.Newer(e.rec.Version) || e.content != b.Content {
		return false, 0
	}
	now := s.clock.Now()
	since := now.Sub(e.seenAt)
	e.rec.Version = b.Version
	e.seenAt = now
	return true, since
}

// Lacks reports whether a beat refers to content newer than the store
// holds (or to a node it has never heard of): the record itself is missing.
func (s *Store) Lacks(b Beat) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.nodes[b.Name]
	return !ok || b.Content.Newer(e.content)
}

// MergeDeployment keeps d if its stamp is later than the one held. d
// travels on encoded as this build encodes it: use mergeDeployment for a
// record that arrived in bytes of its own.
func (s *Store) MergeDeployment(d DeploymentRecord) bool {
	return s.mergeDeployment(depEntry{rec: d})
}

// mergeDeployment is MergeDeployment for a record and its bytes (nil:
// encode it).
func (s *Store) mergeDeployment(d depEntry) bool {
	if d.raw == nil {
		d.raw = rawOf(d.rec)
	}
	version := s.active()
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.deps[d.rec.Name]
	if ok && !supersedes(d, old, version) {
		return false
	}
	if d.rec.Deleted && s.expired(d.rec) {
		// A tombstone too old to matter: do not take it back in.
		return false
	}
	s.deps[d.rec.Name] = d
	return true
}

// supersedes reports whether d replaces old at the active protocol
// version. A later stamp wins. The HLC never issues a stamp twice, so
// equal stamps with different content come from one write as two agent
// releases relay it (below) or from an incorrect node; the merge must stay
// order-independent either way, so equal stamps are ordered by content,
// the rule depending on the version:
//
//   - protocol 1, the rule of agents before this release (9f0749d), which
//     a cluster that still has one must keep: a tombstone wins, then a
//     spec beats none, then the lexically larger encoded spec.
//   - protocol 2: a tombstone wins, then a spec beats none, then the
//     longer encoded spec, then the larger. An agent before this release
//     decodes a spec without the fields it does not know and relays that
//     copy at the write's stamp, in every push/pull; the copy that carries
//     them is the longer one and must win, or one older node would strip
//     a field (start_timeout) from every newer node's copy. Protocol 2 is
//     active only once no such agent is left, but their copies may still
//     circulate for a while.
//
// Encoded specs are compared as the bytes that travel (raw), so a field
// this build does not know counts too. Where all that is equal the whole
// record's bytes decide, the same way (only the order of equal records is
// new: agents before this release keep whichever came first, and cannot
// tell them apart).
func supersedes(d, old depEntry, version int) bool {
	if d.rec.Stamp != old.rec.Stamp {
		return old.rec.Stamp.Less(d.rec.Stamp)
	}
	if d.raw != nil && bytes.Equal(d.raw, old.raw) {
		// The record held, again: what every push/pull brings. The
		// rules below would say the same without decoding it twice.
		return false
	}
	if d.rec.Deleted != old.rec.Deleted {
		return d.rec.Deleted
	}
	if d.rec.Spec == nil || old.rec.Spec == nil {
		if d.rec.Spec != nil || old.rec.Spec != nil {
			// Only invalid records (the receiver's checks drop them) get
			// here; a spec still beats none, so the order stays total.
			return old.rec.Spec == nil
		}
		return greater(d.raw, old.raw, version)
	}
	if c := compareEncoded(specBytes(d), specBytes(old), version); c != 0 {
		return c > 0
	}
	return greater(d.raw, old.raw, version)
}

// greater reports whether a orders after b by compareEncoded.
func greater(a, b []byte, version int) bool { return compareEncoded(a, b, version) > 0 }

// compareEncoded orders two encodings by the version's rule: from
// protocol 2 the longer first, then (at every version) the lexically
// larger.
func compareEncoded(a, b []byte, version int) int {
	if version >= protocol.V2 && len(a) != len(b) {
		if len(a) > len(b) {
			return 1
		}
		return -1
	}
	return bytes.Compare(a, b)
}

// specBytes is the encoded spec of a record that has one: as it travels
// where the record's bytes have it, as this build encodes it otherwise.
func specBytes(d depEntry) []byte {
	var spec struct {
		Spec json.RawMessage `json:"spec"`
	}
	if d.raw != nil && json.Unmarshal(d.raw, &spec) == nil && len(spec.Spec) > 0 {
		return spec.Spec
	}
	b, _ := json.Marshal(d.rec.Spec)
	return b
}

func (s *Store) expired(d DeploymentRecord) bool {
	return d.Deleted && s.clock.Now().Sub(time.UnixMilli(d.Stamp.Wall)) > s.tombstoneTTL
}

// GC forgets tombstones older than the tombstone TTL.
func (s *Store) GC() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, d := range s.deps {
		if s.expired(d.rec) {
			delete(s.deps, name)
		}
	}
}

// NodeState is a stored record with the receiver's renewal time.
type NodeState struct {
	Record NodeRecord
	SeenAt time.Time
}

// Node returns one node's record.
func (s *Store) Node(name string) (NodeState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.nodes[name]
	if !ok {
		return NodeState{}, false
	}
	return NodeState{Record: e.rec, SeenAt: e.seenAt}, true
}

// renewedBefore reports whether the record of name was last renewed
// before cut and not before floor, and the content it holds; false for a
// node it has no record of (a beat or push/pull brings that).
func (s *Store) renewedBefore(name string, cut, floor time.Time) (Version, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.nodes[name]
	if !ok || !e.seenAt.Before(cut) || e.seenAt.Before(floor) {
		return Version{}, false
	}
	return e.content, true
}

// Nodes returns every stored record, sorted by name.
func (s *Store) Nodes() []NodeState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]NodeState, 0, len(s.nodes))
	for _, e := range s.nodes {
		out = append(out, NodeState{Record: e.rec, SeenAt: e.seenAt})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Record.Name < out[j].Record.Name })
	return out
}

// Deployments returns every deployment record, tombstones included, sorted
// by name.
func (s *Store) Deployments() []DeploymentRecord {
	entries := s.depEntries()
	out := make([]DeploymentRecord, len(entries))
	for i, e := range entries {
		out[i] = e.rec
	}
	return out
}

// depEntries returns every deployment record with its bytes, sorted by
// name: what is saved and sent.
func (s *Store) depEntries() []depEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]depEntry, 0, len(s.deps))
	for _, d := range s.deps {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b depEntry) int { return strings.Compare(a.rec.Name, b.rec.Name) })
	return out
}

// Deployment returns one deployment record.
func (s *Store) Deployment(name string) (DeploymentRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.deps[name]
	return d.rec, ok
}

// full returns the whole state for push/pull: every record in its bytes,
// and for a node record that beats advanced past them, the beat that
// brings a receiver to its version (see nodeEntry.raw).
func (s *Store) full() message {
	var m message
	s.mu.Lock()
	names := make([]string, 0, len(s.nodes))
	for name := range s.nodes {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		e := s.nodes[name]
		m.Nodes = append(m.Nodes, e.rec)
		m.nodeRaw = append(m.nodeRaw, e.raw)
		if e.rec.Version != e.rawVersion {
			m.Beats = append(m.Beats, Beat{Name: name, Version: e.rec.Version, Content: e.content})
		}
	}
	s.mu.Unlock()
	for _, d := range s.depEntries() {
		m.Deployments = append(m.Deployments, d.rec)
		m.depRaw = append(m.depRaw, d.raw)
	}
	return m
}
