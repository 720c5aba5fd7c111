package gossip

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/placement"
)

// atVersion is a store whose active protocol version is *v.
func atVersion(v *int) *Store {
	return NewStore(clock.NewFake(time.UnixMilli(1e12)), time.Hour, func() int { return *v })
}

// An agent older than a spec field decodes a deployment without it and
// relays that copy at the write's stamp, in every push/pull. At protocol 2
// a newer node keeps the copy with the field, whichever it hears first:
// otherwise one older node would strip start_timeout from the whole
// cluster.
func TestACopyRelayedByAnOlderAgentDoesNotStripFields(t *testing.T) {
	stamp := Stamp{Wall: 1e12, Origin: "new"}
	full := placement.Deployment{Name: "chat", Model: "m", StartTimeout: placement.Duration(3 * time.Hour)}
	stripped := full
	stripped.StartTimeout = 0 // what a 9f0749d agent reads of it, and sends back
	for _, order := range [][]placement.Deployment{{full, stripped}, {stripped, full}} {
		v := protocol.V2
		s := atVersion(&v)
		for _, d := range order {
			s.MergeDeployment(DeploymentRecord{Name: d.Name, Spec: &d, Stamp: stamp})
		}
		got, _ := s.Deployment("chat")
		if got.Spec == nil || got.Spec.StartTimeout != full.StartTimeout {
			t.Errorf("merged %v then %v: holds %+v, want start_timeout 3h", order[0].StartTimeout, order[1].StartTimeout, got.Spec)
		}
	}
}

// The same holds for a field this build does not know: the spec's bytes
// as they travel are compared, not this build's encoding of what it
// decoded (the two copies decode alike).
func TestACopyWithoutAnUnknownFieldDoesNotStripIt(t *testing.T) {
	full := `{"name":"chat","spec":{"name":"chat","model":"m","replicas":1,"future_field":{"x":1}},"stamp":{"wall":1000000000000,"origin":"new"}}`
	stripped := `{"name":"chat","spec":{"name":"chat","model":"m","replicas":1},"stamp":{"wall":1000000000000,"origin":"new"}}`
	for _, order := range [][]string{{full, stripped}, {stripped, full}} {
		v := protocol.V2
		s := atVersion(&v)
		for _, raw := range order {
			var r DeploymentRecord
			if err := json.Unmarshal([]byte(raw), &r); err != nil {
				t.Fatal(err)
			}
			s.mergeDeployment(depEntry{rec: r, raw: json.RawMessage(raw)})
		}
		if got := s.depEntries()[0].raw; string(got) != full {
			t.Errorf("merged in order %.40q...: holds %s, want the copy with future_field", order[0], got)
		}
	}
}

// At protocol 1, a cluster that still has agents from before this
// release, equal stamps are ordered by their rule (9f0749d): a tombstone
// wins, then a spec beats none, then the lexically larger encoded spec,
// even where that is the shorter one. Protocol 2's rule (longer first)
// would have this build and those agents keep different copies.
func TestEqualStampsFollowTheActiveVersion(t *testing.T) {
	stamp := Stamp{Wall: 1e12, Origin: "n1"}
	larger := DeploymentRecord{Name: "chat", Spec: &placement.Deployment{Name: "chat", Model: "b"}, Stamp: stamp}
	longer := DeploymentRecord{Name: "chat", Spec: &placement.Deployment{Name: "chat", Model: "a", Args: []string{"--x"}}, Stamp: stamp}
	tomb := DeploymentRecord{Name: "chat", Deleted: true, Stamp: stamp}
	cases := []struct {
		version int
		recs    []DeploymentRecord
		want    string // the model held, or "deleted"
	}{
		{protocol.V1, []DeploymentRecord{larger, longer}, "b"},
		{protocol.V2, []DeploymentRecord{larger, longer}, "a"},
		{protocol.V1, []DeploymentRecord{larger, tomb}, "deleted"},
		{protocol.V2, []DeploymentRecord{longer, tomb}, "deleted"},
	}
	for _, tc := range cases {
		for _, reverse := range []bool{false, true} {
			v := tc.version
			s := atVersion(&v)
			for i := range tc.recs {
				if reverse {
					i = len(tc.recs) - 1 - i
				}
				s.MergeDeployment(tc.recs[i])
			}
			got, _ := s.Deployment("chat")
			held := "deleted"
			if !got.Deleted {
				held = got.Spec.Model
			}
			if held != tc.want {
				t.Errorf("protocol %d, reversed %v: holds %s, want %s", tc.version, reverse, held, tc.want)
			}
		}
	}
	// The store asks for the version at each merge: once protocol 2 is
	// active, the longer copy replaces the one protocol 1 chose.
	v := protocol.V1
	s := atVersion(&v)
	s.MergeDeployment(larger)
	s.MergeDeployment(longer)
	v = protocol.V2
	if !s.MergeDeployment(longer) {
		t.Error("at protocol 2 the longer copy did not replace protocol 1's choice")
	}
}

// A beat advances a record's version past the bytes the record is kept
// in. Push/pull then sends the bytes as they are, unknown fields and all,
// and beside them the beat to the current version: a receiver, of this
// release or of the one before, ends at the same version and content.
func TestPushPullCarriesBeatsBesideTheRawRecord(t *testing.T) {
	raw := `{"name":"z","version":{"epoch":1,"seq":5},"content":{"epoch":1,"seq":5},"api":"127.0.0.1:1","gossip":"127.0.0.1:2","gpus":[],"agent_version":"x","started_at":"2025-01-01T00:00:00Z","future_field":{"x":1}}`
	var r NodeRecord
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Unix(100, 0))
	y := NewStore(clk, time.Hour, nil)
	y.mergeNode(r, json.RawMessage(raw))
	beat := Beat{Name: "z", Version: Version{Epoch: 1, Seq: 7}, Content: r.Version}
	if !y.MergeBeat(beat) {
		t.Fatal("the beat was refused")
	}
	m := y.full()
	if len(m.nodeRaw) != 1 || string(m.nodeRaw[0]) != raw {
		t.Fatalf("push/pull sends %q, want the record's bytes unchanged", m.nodeRaw)
	}
	if len(m.Beats) != 1 || m.Beats[0] != beat {
		t.Fatalf("push/pull sends beats %+v, want %+v", m.Beats, beat)
	}
	b, err := encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(inflate(t, b)), `"future_field":{"x":1}`) {
		t.Fatal("the unknown field did not go out")
	}
	// A receiver merges the records, then the beats, as receive does.
	got, err := decode(b)
	if err != nil {
		t.Fatal(err)
	}
	x := NewStore(clk, time.Hour, nil)
	for i, n := range got.Nodes {
		x.mergeNode(n, got.nodeRaw[i])
	}
	for _, bt := range got.Beats {
		x.MergeBeat(bt)
	}
	held, _ := x.Node("z")
	if held.Record.Version != beat.Version {
		t.Fatalf("the receiver is at %+v, want %+v", held.Record.Version, beat.Version)
	}
	// And a later beat of the owner's still matches its content.
	if !x.MergeBeat(Beat{Name: "z", Version: Version{Epoch: 1, Seq: 8}, Content: r.Version}) {
		t.Fatal("the receiver refuses the owner's next beat")
	}
	if m := x.full(); string(m.nodeRaw[0]) != raw {
		t.Fatalf("the receiver relays %s, want the record's bytes unchanged", m.nodeRaw[0])
	}
}
