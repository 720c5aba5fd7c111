package gossip

import (
	"bytes"
	"compress/flate"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/placement"
)

// FuzzDecode feeds the decoder anything, as a whole message and as one
// record among good ones. It never panics; what fails whole wraps
// ErrMalformed; what decodes re-encodes to the same records in the same
// bytes (a relay passes them on unchanged); and a record that does not
// decode costs itself alone: the good records beside it are taken.
func FuzzDecode(f *testing.F) {
	good, _ := encode(message{Nodes: []NodeRecord{{Name: "a", GPUs: gpus(2, "a")}}, Beats: []Beat{{Name: "a"}}})
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{2, 3, 4})
	f.Add(append([]byte{1}, []byte("not deflate")...))
	f.Add([]byte(`{"name":"x","gpus":{"count":8}}`))        // a field that became an object
	f.Add([]byte(`{"name":"x","version":"2"}`))             // a field that became a string
	f.Add([]byte(`{"name":"x","future_field":{"x":1}}`))    // a field this build does not know
	f.Add([]byte(`{"name":"chat","spec":{"replicas":{}}}`)) // a deployment's spec field retyped
	f.Add([]byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decode(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("decode error %v does not wrap ErrMalformed", err)
			}
		} else {
			// Whatever decodes must re-encode and decode to the same
			// records, in the same bytes.
			again, err := encode(m)
			if err != nil {
				t.Fatal(err)
			}
			m2, err := decode(again)
			if err != nil {
				t.Fatalf("re-decode: %v", err)
			}
			same := func(a, b json.RawMessage) bool { return bytes.Equal(a, b) }
			if !slices.EqualFunc(m.nodeRaw, m2.nodeRaw, same) || !slices.EqualFunc(m.depRaw, m2.depRaw, same) || len(m.Beats) != len(m2.Beats) {
				t.Fatalf("re-encoding changed the records:\n%q\n%q", m.nodeRaw, m2.nodeRaw)
			}
		}

		// b as one record between two good ones, in each list.
		one := b
		if !json.Valid(one) {
			one, _ = json.Marshal(string(b))
		}
		n1, n2 := `{"name":"good-1","version":{"epoch":1,"seq":1}}`, `{"name":"good-2","version":{"epoch":1,"seq":1}}`
		d1, d2 := `{"name":"dep-1","deleted":true,"stamp":{"wall":1,"origin":"n"}}`, `{"name":"dep-2","deleted":true,"stamp":{"wall":1,"origin":"n"}}`
		env := `{"nodes":[` + n1 + `,` + string(one) + `,` + n2 + `],"deployments":[` + d1 + `,` + string(one) + `,` + d2 + `],"beats":[` + string(one) + `]}`
		m, err = decode(deflated(t, env))
		if err != nil {
			t.Fatalf("a message with one odd record failed whole: %v", err)
		}
		if !hasRaw(m.nodeRaw, n1) || !hasRaw(m.nodeRaw, n2) || !hasRaw(m.depRaw, d1) || !hasRaw(m.depRaw, d2) {
			t.Fatalf("the good records beside %q were lost: nodes %q, deployments %q", one, m.nodeRaw, m.depRaw)
		}
		if len(m.Nodes)+len(m.Deployments)+len(m.Beats)+len(m.bad) != 7 {
			t.Fatalf("7 records in, %d decoded and %d bad out", len(m.Nodes)+len(m.Deployments)+len(m.Beats), len(m.bad))
		}
	})
}

// deflated is a wire message holding the envelope env as it is.
func deflated(t testing.TB, env string) []byte {
	t.Helper()
	var buf bytes.Buffer
	buf.WriteByte(formatDeflateJSON)
	w, err := flate.NewWriter(&buf, flate.BestSpeed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte(env)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func hasRaw(raws []json.RawMessage, want string) bool {
	return slices.ContainsFunc(raws, func(r json.RawMessage) bool { return string(r) == want })
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
		version := rapid.IntRange(protocol.V1, protocol.Max).Draw(t, "version")
		active := func() int { return version }
		s1, s2 := NewStore(clk, time.Hour, active), NewStore(clk, time.Hour, active)
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
	y, x := NewStore(clk, time.Hour, nil), NewStore(clk, time.Hour, nil)
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
