package datadir

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// TestLayout pins the names: agents of other versions, and operators, find
// their files by them.
func TestLayout(t *testing.T) {
	d := New("/var/lib/llmgw")
	for got, want := range map[string]string{
		d.Root():                      "/var/lib/llmgw",
		d.NodeFile():                  "/var/lib/llmgw/node.json",
		d.DeploymentsFile():           "/var/lib/llmgw/deployments.json",
		d.TokenFile():                 "/var/lib/llmgw/token",
		d.RenewalFile():               "/var/lib/llmgw/renewal.json",
		d.GossipKeyFile():             "/var/lib/llmgw/gossip.key",
		d.ShardsDir():                 "/var/lib/llmgw/shards",
		d.LogsDir():                   "/var/lib/llmgw/logs",
		d.EngineLogFile("chat-0-abc"): "/var/lib/llmgw/logs/chat-0-abc.log",
		d.RuntimeDir():                "/var/lib/llmgw/runtime",
	} {
		if got != want {
			t.Errorf("path %q, want %q", got, want)
		}
	}
}

// A viewer's ReadShardStates leaves a corrupt file where it is, unchanged;
// the agent's shardstate.Load (over the same dir) moves it aside.
func TestReadShardStatesLeavesCorruptFilesInPlace(t *testing.T) {
	d := New(t.TempDir())
	if err := os.MkdirAll(d.ShardsDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	good := shardstate.State{ShardID: "good-0", ReplicaID: "good-0", Spec: shardstate.Spec{EngineID: "good-0-v1", SpecVersion: "v1"}}
	if err := shardstate.Save(d.ShardsDir(), good); err != nil {
		t.Fatal(err)
	}
	corrupt := filepath.Join(d.ShardsDir(), "shard-chat-0-v1.json")
	content := []byte(`{"format_version":1,"shard_id":"ch`)
	if err := os.WriteFile(corrupt, content, 0o600); err != nil {
		t.Fatal(err)
	}

	states, bad := d.ReadShardStates()
	if len(states) != 1 || states[0].ShardID != "good-0" {
		t.Fatalf("states %+v, want good-0", states)
	}
	if len(bad) != 1 || bad[0].Path != corrupt || bad[0].Err == nil || bad[0].MovedTo != "" {
		t.Fatalf("bad %+v, want %s reported and not moved", bad, corrupt)
	}
	if b, err := os.ReadFile(corrupt); err != nil || !reflect.DeepEqual(b, content) {
		t.Fatalf("after ReadShardStates the corrupt file reads %q, %v; want it in place, unchanged", b, err)
	}
	if m, _ := filepath.Glob(corrupt + ".corrupt-*"); len(m) != 0 {
		t.Fatalf("ReadShardStates set %v aside", m)
	}

	_, bad = shardstate.Load(d.ShardsDir())
	if len(bad) != 1 || bad[0].MovedTo == "" {
		t.Fatalf("Load reported %+v; want the corrupt file moved aside", bad)
	}
	if _, err := os.Stat(corrupt); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after Load the corrupt file is still in place (%v)", err)
	}
	if b, _ := os.ReadFile(bad[0].MovedTo); !reflect.DeepEqual(b, content) {
		t.Fatalf("moved-aside file holds %q, want the evidence", b)
	}
}

func TestReadShardStatesOfAnEmptyDataDir(t *testing.T) {
	states, bad := New(t.TempDir()).ReadShardStates()
	if len(states) != 0 || len(bad) != 0 {
		t.Fatalf("states %v bad %v", states, bad)
	}
}

func TestIdentity(t *testing.T) {
	d := New(t.TempDir())
	if _, found, err := d.ReadIdentity(); found || err != nil {
		t.Fatalf("no node.json: found=%v err=%v", found, err)
	}
	want := Identity{Name: "n1", Epoch: 42, Peers: []string{"10.0.0.2:7946"}}
	if err := d.WriteIdentity(want); err != nil {
		t.Fatal(err)
	}
	want.Protocol = IdentityProtocol // stamped by the writer
	got, found, err := d.ReadIdentity()
	if err != nil || !found || !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadIdentity = %+v, %v, %v; want %+v", got, found, err, want)
	}
	// The JSON names older and newer agents read, and the protocol whose
	// layout the file is in.
	if b, _ := os.ReadFile(d.NodeFile()); string(b) != "{\n  \"protocol\": 2,\n  \"name\": \"n1\",\n  \"epoch\": 42,\n  \"peers\": [\n    \"10.0.0.2:7946\"\n  ]\n}" {
		t.Errorf("node.json = %s", b)
	}
}

// A corrupt node.json is reported as such and left alone.
func TestReadIdentityOfACorruptFile(t *testing.T) {
	d := New(t.TempDir())
	if err := os.WriteFile(d.NodeFile(), []byte(`{"name":`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, found, err := d.ReadIdentity(); !found || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("found=%v err=%v; want found and ErrCorrupt", found, err)
	}
	if b, _ := os.ReadFile(d.NodeFile()); string(b) != `{"name":` {
		t.Fatalf("node.json changed to %q", b)
	}
}

// The renewal time survives a round trip to the file; a missing file is no
// error and a corrupt one says so and stays.
func TestRenewal(t *testing.T) {
	d := New(t.TempDir())
	if _, found, err := d.ReadRenewal(); found || err != nil {
		t.Fatalf("no file: found %v, err %v", found, err)
	}
	at := time.Date(2026, 12, 1, 12, 0, 0, 123, time.UTC)
	if err := d.WriteRenewal(at); err != nil {
		t.Fatal(err)
	}
	got, found, err := d.ReadRenewal()
	if err != nil || !found || !got.Equal(at) {
		t.Fatalf("read back %v (found %v, err %v), want %v", got, found, err, at)
	}
	if err := os.WriteFile(d.RenewalFile(), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.ReadRenewal(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt file: err %v, want ErrCorrupt", err)
	}
}
