package gossip

import (
	"errors"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement"
)

func FuzzDecode(f *testing.F) {
	good, _ := encode(message{Nodes: []NodeRecord{{Name: "a", GPUs: gpus(2, "a")}}, Beats: []Beat{{Name: "a"}}})
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{2, 3, 4})
	f.Add(append([]byte{1}, []byte("not deflate")...))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decode(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("decode error %v does not wrap ErrMalformed", err)
			}
			return
		}
		// Whatever decodes must re-encode and decode to the same thing.
		again, err := encode(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decode(again); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

func TestMalformedMessagesAreCountedAndDropped(t *testing.T) {
	a := startNode(t, "a", 0, "", nil)
	for _, b := range [][]byte{nil, {9}, {1, 2, 3}} {
		a.receive(b, true)
	}
	if got := a.Stats().Dropped; got != 3 {
		t.Fatalf("dropped %d, want 3", got)
	}
}

// Deployment merge is a CRDT: any order of the same records gives the same
// state, duplicates included.
func TestDeploymentMergeIsOrderIndependent(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		names := []string{"a", "b", "c"}
		recs := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) DeploymentRecord {
			name := rapid.SampledFrom(names).Draw(t, "name")
			st := Stamp{Wall: rapid.Int64Range(1e12, 1e12+5).Draw(t, "wall"), Logical: uint32(rapid.IntRange(0, 2).Draw(t, "l")), Origin: rapid.SampledFrom([]string{"n1", "n2"}).Draw(t, "o")}
			if rapid.Bool().Draw(t, "del") {
				return DeploymentRecord{Name: name, Deleted: true, Stamp: st}
			}
			spec := placement.Deployment{Name: name, Model: rapid.SampledFrom([]string{"x", "y"}).Draw(t, "model")}
			return DeploymentRecord{Name: name, Spec: &spec, Stamp: st}
		}), 1, 12).Draw(t, "records")
		clk := clock.NewFake(time.UnixMilli(1e12 + 10))
		s1, s2 := NewStore(clk, time.Hour), NewStore(clk, time.Hour)
		for _, r := range recs {
			s1.MergeDeployment(r)
		}
		perm := rapid.Permutation(recs).Draw(t, "perm")
		for _, r := range perm {
			s2.MergeDeployment(r)
			s2.MergeDeployment(r) // idempotent
		}
		d1, d2 := s1.Deployments(), s2.Deployments()
		if len(d1) != len(d2) {
			t.Fatalf("%d vs %d deployments", len(d1), len(d2))
		}
		for i := range d1 {
			if d1[i].Stamp != d2[i].Stamp || d1[i].Deleted != d2[i].Deleted || (d1[i].Spec != nil && d1[i].Spec.Model != d2[i].Spec.Model) {
				t.Fatalf("%+v vs %+v", d1[i], d2[i])
			}
		}
	})
}

func TestHLCNeverGoesBackAndPassesWitnessedStamps(t *testing.T) {
	clk := clock.NewFake(time.UnixMilli(1000))
	h := NewHLC("n1", clk)
	s1 := h.Now()
	clk.Advance(-500 * time.Millisecond) // the clock steps back
	s2 := h.Now()
	if !s1.Less(s2) {
		t.Fatalf("%v then %v: went backwards", s1, s2)
	}
	remote := Stamp{Wall: 9000, Logical: 3, Origin: "n2"}
	h.Witness(remote)
	if s3 := h.Now(); !remote.Less(s3) {
		t.Fatalf("%v issued after witnessing %v", s3, remote)
	}
}

// A record relayed by push/pull after beats advanced its version still
// says which content it holds, so later beats keep renewing it.
func TestRelayedRecordKeepsAcceptingBeats(t *testing.T) {
	clk := clock.NewFake(time.Unix(100, 0))
	owner := NodeRecord{Name: "z", Version: Version{Epoch: 1, Seq: 5}, Content: Version{Epoch: 1, Seq: 5}}
	y, x := NewStore(clk, time.Hour), NewStore(clk, time.Hour)
	y.MergeNode(owner)
	if !y.MergeBeat(Beat{Name: "z", Version: Version{Epoch: 1, Seq: 6}, Content: owner.Content}) {
		t.Fatal("y rejected the first beat")
	}
	// x learns z's record from y (push/pull): version 6, content 5.
	relayed, _ := y.Node("z")
	x.MergeNode(relayed.Record)
	if !x.MergeBeat(Beat{Name: "z", Version: Version{Epoch: 1, Seq: 7}, Content: owner.Content}) {
		t.Fatal("x rejects renewals after a relayed record")
	}
}
