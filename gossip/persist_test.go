package gossip

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/internal/testmem"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/placement"
)

// FuzzLoadDeployments feeds the deployments.json loader anything: it
// never panics, its errors name the file, what it takes in (records that
// pass the same checks as a peer's) is what a peer's message can carry
// (push/pull sends the whole store), and what it allocates is a small
// multiple of the file plus a constant.
func FuzzLoadDeployments(f *testing.F) {
	spec := placement.Deployment{Name: "chat", Model: "m", Replicas: 2, Labels: map[string]string{"zone": "a"}, Args: []string{"--x"}}
	good, _ := json.MarshalIndent(deploymentsOnDisk{Protocol: protocol.V2, Deployments: []json.RawMessage{
		rawOf(DeploymentRecord{Name: "chat", Spec: &spec, Stamp: Stamp{Wall: 1700000000000, Logical: 3, Origin: "n1"}}),
		rawOf(DeploymentRecord{Name: "old", Deleted: true, Stamp: Stamp{Wall: 1700000000001, Origin: "n2"}}),
	}}, "", "  ")
	f.Add(good)
	if old, err := os.ReadFile(filepath.Join("testdata", "9f0749d", deploymentsFile)); err == nil {
		f.Add(old) // as the previous release wrote it
	}
	f.Add([]byte(`{"protocol":3,"deployments":[]}`))
	f.Add([]byte(`{"protocol":-1,"deployments":[]}`))
	f.Add([]byte(`{"protocol":2,"deployments":[{"name":"a","spec":{"name":"a","model":"m","replicas":{}},"stamp":{"wall":1700000000000,"origin":"n"}},{"name":"b","deleted":true,"stamp":{"wall":1700000000000,"origin":"n"}}]}`))
	f.Add(good[:len(good)/2]) // truncated, as by a full disk
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"format_version":1,"deployments":[{"name":"a"}]}`))
	f.Add([]byte(`{"format_version":1,"deployments":[{"name":"a","spec":{"name":"b","model":"m"}}]}`))
	f.Add([]byte(`{"format_version":1,"deployments":[{"name":"a","deleted":true,"stamp":{"wall":9223372036854775807,"logical":4294967295}}]}`))
	f.Add([]byte(`{"x":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`))
	f.Add([]byte(`{"deployments":[` + strings.Repeat(`{"name":"a","deleted":true},`, 2000) + `{"name":"a","deleted":true}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		const path = "/data/deployments.json"
		var (
			recs []depEntry
			err  error
		)
		clk := clock.NewFake(time.UnixMilli(1700000000000))
		store, hlc := NewStore(clk, time.Hour, nil), NewHLC("n", clk)
		got := testmem.Allocated(func() {
			if recs, _, err = parseDeployments(b, path); err == nil {
				for _, r := range recs {
					if _, bad := checkDeployment(r.rec, clk.Now()); bad != nil {
						continue
					}
					hlc.Witness(r.rec.Stamp)
					store.mergeDeployment(r)
				}
				hlc.Now()
			}
		})
		if limit := 64*uint64(len(b)) + 1<<20; testmem.Exact() && got > limit {
			t.Fatalf("a %d-byte file allocated %d bytes, over its budget of %d", len(b), got, limit)
		}
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		wire, err := encode(store.full())
		if err != nil {
			t.Fatal(err)
		}
		m, err := decode(wire)
		if err != nil || len(m.bad) > 0 {
			t.Fatalf("a peer would drop what the store took in: %v %v", err, m.bad)
		}
	})
}

// Tombstones past the TTL are forgotten by the hourly collection, which
// runs on the cluster's clock; live deployments stay.
func TestTombstonesAreCollectedHourlyOnTheClusterClock(t *testing.T) {
	clk := clock.NewFake(time.Now())
	a := startNode(t, "a", 0, "", func(c *Config) { c.Clock = clk; c.TombstoneTTL = time.Minute })
	for _, name := range []string{"chat", "gone"} {
		if _, err := a.PutDeployment(*specNamed(name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, err := a.DeleteDeployment("gone"); !ok || err != nil {
		t.Fatalf("delete: %v, %v", ok, err)
	}
	// An hour more at each look: the collection's ticker may arm after
	// another loop's (the cluster version's), and a fake clock's waiters
	// do not say whose they are.
	testwait.Until(t, 5*time.Second, "the tombstone collected", func() (bool, string) {
		clk.Advance(time.Hour)
		_, held := a.store.Deployment("gone")
		return !held, fmt.Sprintf("held: %v", a.Deployments())
	})
	if _, ok := a.Deployment("chat"); !ok {
		t.Error("the collection forgot a live deployment")
	}
}

// deployments.json as the previous release (9f0749d) wrote it, without
// "protocol", loads as protocol 1: every record, each spec reading as it
// did there (the same spec version, so no engine rolls for the upgrade).
// The next save writes it in this release's protocol, and the records in
// the bytes they came in.
func TestDeploymentsFileOfThePreviousReleaseLoads(t *testing.T) {
	old, err := os.ReadFile(filepath.Join("testdata", "9f0749d", deploymentsFile))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, deploymentsFile), old, 0o600); err != nil {
		t.Fatal(err)
	}
	// The file's clock: its stamps are neither ahead nor expired.
	clk := clock.NewFake(time.UnixMilli(1764633600000).Add(time.Minute))
	a := startNode(t, "a", 0, dir, func(c *Config) { c.Clock = clk })
	// What 9f0749d's SpecVersion said of each (placement.TestSpecVersionIsThePreviousReleases pins more).
	for name, want := range map[string]string{"chat": "0278b391452d", "big": "289750f6e286"} {
		d, ok := a.Deployment(name)
		if !ok || d.Spec.SpecVersion() != want {
			t.Errorf("%s: loaded %v with spec version %s, want %s", name, ok, d.Spec.SpecVersion(), want)
		}
	}
	if d, ok := a.store.Deployment("gone"); !ok || !d.Deleted {
		t.Errorf("the tombstone did not load: %+v", d)
	}
	if err := a.Shutdown(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, deploymentsFile))
	if err != nil {
		t.Fatal(err)
	}
	var saved deploymentsOnDisk
	if err := json.Unmarshal(b, &saved); err != nil {
		t.Fatal(err)
	}
	if saved.Protocol != protocol.V2 || len(saved.Deployments) != 3 {
		t.Fatalf("saved protocol %d with %d records, want protocol 2 with 3:\n%s", saved.Protocol, len(saved.Deployments), b)
	}
	var oldFile struct{ Deployments []json.RawMessage }
	if err := json.Unmarshal(old, &oldFile); err != nil {
		t.Fatal(err)
	}
	for i := range oldFile.Deployments {
		var was, is bytes.Buffer
		_ = json.Compact(&was, oldFile.Deployments[i])
		_ = json.Compact(&is, saved.Deployments[i])
		if was.String() != is.String() {
			t.Errorf("record %d changed on the way through:\n%s\n%s", i, was.String(), is.String())
		}
	}
}

// A deployments.json that an llmgw of a newer protocol wrote may be laid
// out in ways this build cannot read: the start stops with an error that
// names the file, its protocol, this build's range and the fix, and
// nothing on disk changes.
func TestDeploymentsFileOfANewerProtocolStopsTheStart(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, deploymentsFile)
	newer := fmt.Appendf(nil, `{"protocol": %d, "deployments": [{"name": "chat", "layout": "unknown"}]}`, protocol.Max+1)
	if err := os.WriteFile(path, newer, 0o600); err != nil {
		t.Fatal(err)
	}
	prof, _ := ProfileByName("local")
	_, err := New(Config{Name: "a", BindAddr: "127.0.0.1", Profile: prof, Label: "test", DeploymentsFile: path}, NodeRecord{Version: Version{Epoch: time.Now().UnixNano()}})
	if err == nil {
		t.Fatal("a node started on a deployments.json of a newer protocol")
	}
	for _, want := range []string{path, fmt.Sprintf("protocol %d", protocol.Max+1), fmt.Sprintf("protocols %d to %d", protocol.Min, protocol.Max), fmt.Sprintf("speaks protocol %d or later", protocol.Max+1)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	b, rerr := os.ReadFile(path)
	if rerr != nil || !bytes.Equal(b, newer) {
		t.Errorf("the file changed: %q (%v)", b, rerr)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the data dir holds %d entries, want the file alone", len(entries))
	}
}

// Every write of deployments.json says which protocol's format it is in.
func TestDeploymentsFileSaysItsProtocol(t *testing.T) {
	dir := t.TempDir()
	a := startNode(t, "a", 0, dir, nil)
	if _, err := a.PutDeployment(*specNamed("chat")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, deploymentsFile))
	if err != nil {
		t.Fatal(err)
	}
	var head struct {
		Protocol *int `json:"protocol"`
	}
	if err := json.Unmarshal(b, &head); err != nil || head.Protocol == nil || *head.Protocol != protocol.V2 {
		t.Fatalf("deployments.json says protocol %v (%v), want %d:\n%s", head.Protocol, err, protocol.V2, b)
	}
}
