package gossip

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/placement"
)

func depRecord(name string, spec *placement.Deployment, wall int64) DeploymentRecord {
	return DeploymentRecord{Name: name, Spec: spec, Stamp: Stamp{Wall: wall, Origin: "n1"}}
}

func specNamed(name string) *placement.Deployment {
	d := placement.Deployment{Name: name, Model: "m", Replicas: 1}
	return &d
}

// One bad record in a message (a push/pull carries the whole state) must
// not keep the good ones out: that is how one node's bad record would stop
// its peers from repairing each other.
func TestOneBadRecordIsDroppedAloneAndCounted(t *testing.T) {
	a := startNode(t, "a", 0, "", nil)
	now := time.Now().UnixMilli()
	invalid := specNamed("bad-spec")
	invalid.Replicas = -1
	m := message{
		Deployments: []DeploymentRecord{
			depRecord("good", specNamed("good"), now),
			depRecord("renamed", specNamed("other"), now), // record name is not the spec name
			depRecord("bad-spec", invalid, now),           // fails Validate
			{Name: "Not_A_Name", Deleted: true, Stamp: Stamp{Wall: now, Origin: "n1"}},
			{Name: "nospec", Stamp: Stamp{Wall: now, Origin: "n1"}}, // neither spec nor tombstone
		},
		Nodes: []NodeRecord{
			{Version: Version{Epoch: 1, Seq: 1}}, // no name
			{Name: "peer", Version: Version{Epoch: 1, Seq: 1}, API: "127.0.0.1:2"},
		},
	}
	b, err := encode(m)
	if err != nil {
		t.Fatal(err)
	}
	a.receive(b, false)
	if _, ok := a.store.Deployment("good"); !ok {
		t.Error("the good deployment was dropped with the bad ones")
	}
	if _, ok := a.store.Node("peer"); !ok {
		t.Error("the good node record was dropped with the bad one")
	}
	for _, name := range []string{"renamed", "other", "bad-spec", "Not_A_Name", "nospec"} {
		if d, ok := a.store.Deployment(name); ok {
			t.Errorf("bad record %q taken in: %+v", name, d)
		}
	}
	st := a.Stats()
	if got := st.Drops[DropInvalidDeployment]; got != 4 {
		t.Errorf("invalid deployments counted %d, want 4 (%v)", got, st.Drops)
	}
	if got := st.Drops[DropInvalidNode]; got != 1 {
		t.Errorf("invalid node records counted %d, want 1 (%v)", got, st.Drops)
	}
	if st.Dropped != 0 {
		t.Errorf("%d whole messages dropped, want 0: only records were bad", st.Dropped)
	}
	if l := a.log.String(); !strings.Contains(l, "renamed") || !strings.Contains(l, "replicas") {
		t.Errorf("the log does not name the bad records and fields:\n%s", l)
	}
}

// deployments.json gets the same checks as gossip: a bad record is left
// out and counted, and the rest loads.
func TestLoadedDeploymentsAreValidated(t *testing.T) {
	dir := t.TempDir()
	now := time.Now().UnixMilli()
	invalid := specNamed("bad-spec")
	invalid.Engine = "nope"
	writeDeploymentsFile(t, dir, depRecord("good", specNamed("good"), now), depRecord("renamed", specNamed("other"), now), depRecord("bad-spec", invalid, now))
	a := startNode(t, "a", 0, dir, nil)
	if _, ok := a.store.Deployment("good"); !ok {
		t.Error("the good deployment did not load")
	}
	for _, name := range []string{"renamed", "bad-spec"} {
		if _, ok := a.store.Deployment(name); ok {
			t.Errorf("bad record %q loaded", name)
		}
	}
	if got := a.Stats().Drops[DropInvalidDeployment]; got != 2 {
		t.Errorf("invalid deployments counted %d, want 2", got)
	}
	if l := a.log.String(); !strings.Contains(l, "engine") || !strings.Contains(l, deploymentsFile) {
		t.Errorf("the log does not name the file and the bad field:\n%s", l)
	}
}

func writeDeploymentsFile(t *testing.T, dir string, recs ...DeploymentRecord) {
	t.Helper()
	b, err := json.Marshal(deploymentsOnDisk{FormatVersion: 1, Deployments: recs})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, deploymentsFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}
