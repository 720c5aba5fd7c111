package gossip

import (
	"encoding/json"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
)

// Store is one node's copy of the replicated state. Its merge operations
// are idempotent, commutative and associative: whatever order records
// arrive in, two stores that saw the same records hold the same state.
type Store struct {
	mu    sync.Mutex
	clock clock.Clock
	nodes map[string]*nodeEntry
	deps  map[string]DeploymentRecord
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
	// seenAt is this node's clock when it last accepted a newer version of
	// the record: the start of every lease's TTL on this receiver.
	seenAt time.Time
}

// NewStore returns an empty store judging time by clk.
func NewStore(clk clock.Clock, tombstoneTTL time.Duration) *Store {
	return &Store{clock: clk, nodes: map[string]*nodeEntry{}, deps: map[string]DeploymentRecord{}, tombstoneTTL: tombstoneTTL}
}

// MergeNode keeps r if it is newer than what the store holds. It reports
// whether anything changed.
func (s *Store) MergeNode(r NodeRecord) bool {
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
	r.Content = content
	s.nodes[r.Name] = &nodeEntry{rec: r, content: content, seenAt: s.clock.Now()}
	return true
}

// MergeBeat applies a renewal. It reports whether it was accepted; a beat
// for content the store does not have is ignored until the full record
// arrives.
func (s *Store) MergeBeat(b Beat) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.nodes[b.Name]
	if !ok || !b.Version.Newer(e.rec.Version) || e.content != b.Content {
		return false
	}
	e.rec.Version = b.Version
	e.seenAt = s.clock.Now()
	return true
}

// Lacks reports whether a beat refers to content newer than the store
// holds (or to a node it has never heard of): the record itself is missing.
func (s *Store) Lacks(b Beat) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.nodes[b.Name]
	return !ok || b.Content.Newer(e.content)
}

// MergeDeployment keeps d if its stamp is later than the one held.
func (s *Store) MergeDeployment(d DeploymentRecord) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.deps[d.Name]
	if ok && !supersedes(d, old) {
		return false
	}
	if d.Deleted && s.expired(d) {
		// A tombstone too old to matter: do not take it back in.
		return false
	}
	s.deps[d.Name] = d
	return true
}

// supersedes reports whether d replaces old. A later stamp wins. The HLC
// never issues a stamp twice, so equal stamps with different content come
// from one write read by two agent versions (below) or from an incorrect
// node; the merge must stay order-independent either way: a tombstone
// wins, then the longer encoded spec, then the larger.
//
// Longer first: an older agent decodes a spec without the fields it does
// not know and relays that copy, at the write's stamp, in every push/pull.
// The copy that carries them is the longer one, and must win, or one older
// node in the cluster would strip a new field (start_timeout) from every
// newer node's copy. An older agent itself keeps its own copy whichever it
// hears: it cannot tell the two apart.
func supersedes(d, old DeploymentRecord) bool {
	if d.Stamp != old.Stamp {
		return old.Stamp.Less(d.Stamp)
	}
	if d.Deleted != old.Deleted {
		return d.Deleted
	}
	if d.Spec == nil || old.Spec == nil {
		// Only invalid records (the receiver's checks drop them) get
		// here; a spec still beats none, so the order stays total.
		return old.Spec == nil && d.Spec != nil
	}
	a, _ := json.Marshal(d.Spec)
	b, _ := json.Marshal(old.Spec)
	if len(a) != len(b) {
		return len(a) > len(b)
	}
	return string(a) > string(b)
}

func (s *Store) expired(d DeploymentRecord) bool {
	return d.Deleted && s.clock.Now().Sub(time.UnixMilli(d.Stamp.Wall)) > s.tombstoneTTL
}

// GC forgets tombstones older than the tombstone TTL.
func (s *Store) GC() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, d := range s.deps {
		if s.expired(d) {
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
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]DeploymentRecord, 0, len(s.deps))
	for _, d := range s.deps {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b DeploymentRecord) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// Deployment returns one deployment record.
func (s *Store) Deployment(name string) (DeploymentRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.deps[name]
	return d, ok
}

// full returns the whole state for push/pull.
func (s *Store) full() message {
	var m message
	for _, n := range s.Nodes() {
		m.Nodes = append(m.Nodes, n.Record)
	}
	m.Deployments = s.Deployments()
	return m
}
