package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/internal/testwait"
	"github.com/llmgw/llmgw/supervisor/datadir"
)

// A node that once booted with its clock a year ahead stored that epoch.
// Its peers refuse epochs that far ahead, and max(old+1, now) would keep
// it there for a year: the node must start over at now instead.
func TestFutureBootEpochIsResetSoPeersTakeTheNode(t *testing.T) {
	h := newHarness(t)
	a := h.start("a")
	cfg := h.config("b", h.gossipAddr("a"))
	future := time.Now().Add(365 * 24 * time.Hour).UnixNano()
	if err := datadir.New(cfg.DataDir).WriteIdentity(datadir.Identity{Name: "b", Epoch: future}); err != nil {
		t.Fatal(err)
	}
	b := h.start("b", h.gossipAddr("a"))
	if e := b.Cluster().Local().Version.Epoch; e >= future {
		t.Errorf("b's epoch %d was kept, not reset", e)
	}
	testwait.Until(t, 10*time.Second, "a holds b's record", func() (bool, string) {
		for _, m := range a.Cluster().Members() {
			if m.Name == "b" {
				return m.Record != nil, fmt.Sprintf("%s record=%v", m.State, m.Record != nil)
			}
		}
		return false, "b unknown"
	})
}

func TestLoadIdentityResetsOnlyAFarFutureEpoch(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, c := range []struct {
		name       string
		stored     int64
		want       int64
		logsAReset bool
	}{
		{"in the past", now.Add(-time.Hour).UnixNano(), now.UnixNano(), false},
		{"ahead, within the bound: bumped", now.Add(gossip.MaxClockOffset / 2).UnixNano(), now.Add(gossip.MaxClockOffset/2).UnixNano() + 1, false},
		{"far ahead: reset", now.Add(time.Hour).UnixNano(), now.UnixNano(), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := datadir.New(t.TempDir())
			if err := dir.WriteIdentity(datadir.Identity{Name: "n1", Epoch: c.stored}); err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			id, err := loadIdentity(dir, "n1", now, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			if id.Epoch != c.want {
				t.Errorf("epoch %d, want %d", id.Epoch, c.want)
			}
			if onDisk, _, _ := dir.ReadIdentity(); onDisk.Epoch != id.Epoch {
				t.Errorf("node.json holds %d, want %d", onDisk.Epoch, id.Epoch)
			}
			if got := strings.Contains(logs.String(), "boot epoch"); got != c.logsAReset {
				t.Errorf("logged a reset: %v, want %v:\n%s", got, c.logsAReset, logs.String())
			}
		})
	}
}

// The active cluster version saved while the node runs is what the next
// start reads, and saving it keeps the rest of node.json (name, epoch,
// peers) as it was; it never goes down.
func TestActiveVersionSurvivesARestart(t *testing.T) {
	dir := datadir.New(t.TempDir())
	log := slog.New(slog.DiscardHandler)
	now := time.Unix(1_800_000_000, 0)
	id, err := loadIdentity(dir, "n1", now, log)
	if err != nil {
		t.Fatal(err)
	}
	if id.ActiveVersion != 0 {
		t.Fatalf("a new node starts at active version %d, want 0 (none seen)", id.ActiveVersion)
	}
	i := &identity{dir: dir, id: id, log: log}
	i.rememberPeers("n1", []gossip.Member{{Name: "n2", State: gossip.StateAlive, Address: "10.0.0.2:7946"}})
	if err := i.saveActiveVersion(2); err != nil {
		t.Fatal(err)
	}
	if err := i.saveActiveVersion(1); err != nil { // never down
		t.Fatal(err)
	}
	onDisk, _, err := dir.ReadIdentity()
	if err != nil {
		t.Fatal(err)
	}
	want := datadir.Identity{Protocol: datadir.IdentityProtocol, Name: "n1", Epoch: id.Epoch, Peers: []string{"10.0.0.2:7946"}, ActiveVersion: 2}
	if !reflect.DeepEqual(onDisk, want) {
		t.Fatalf("node.json holds %+v, want %+v", onDisk, want)
	}
	next, err := loadIdentity(dir, "n1", now.Add(time.Minute), log)
	if err != nil {
		t.Fatal(err)
	}
	if next.ActiveVersion != 2 || next.Epoch <= id.Epoch || !slices.Equal(next.Peers, want.Peers) {
		t.Fatalf("after a restart: %+v; want active version 2, a later epoch and the peers", next)
	}
}

// node.json as 9f0749d wrote it (no protocol): the upgraded agent keeps
// its name and peers, bumps its epoch and writes this build's protocol.
func TestLoadIdentityOfThePreviousRelease(t *testing.T) {
	dir := datadir.New(t.TempDir())
	old, err := os.ReadFile("datadir/testdata/9f0749d/node.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir.NodeFile(), old, 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 1767322800000000000).Add(time.Hour)
	id, err := loadIdentity(dir, "gpu-1", now, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if id.Name != "gpu-1" || id.Epoch != now.UnixNano() || !slices.Equal(id.Peers, []string{"10.0.0.2:7946", "10.0.0.3:7946"}) {
		t.Fatalf("identity %+v", id)
	}
	if onDisk, _, err := dir.ReadIdentity(); err != nil || onDisk.Protocol != protocol.V2 || onDisk.Epoch != id.Epoch {
		t.Fatalf("node.json rewritten as %+v, %v; want protocol 2 and the new epoch", onDisk, err)
	}
}

// A data dir a newer llmgw wrote (here one shard state file of protocol
// Max+1) stops Start with the message naming the file, and Start writes
// nothing there: node.json keeps its epoch, no renewal is noted.
func TestStartRefusesADataDirOfANewerProtocol(t *testing.T) {
	h := newHarness(t)
	cfg := h.config("a")
	dir := datadir.New(cfg.DataDir)
	if err := dir.WriteIdentity(datadir.Identity{Name: "a", Epoch: 7}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir.ShardsDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	newer := fmt.Sprintf(`{"protocol":%d,"format_version":1,"shard_id":"chat-0","spec":{"engine_id":"chat-0-v9"}}`, protocol.Max+1)
	if err := os.WriteFile(filepath.Join(dir.ShardsDir(), "shard-chat-0-v9.json"), []byte(newer), 0o600); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(dir.NodeFile())
	n, err := Start(context.Background(), cfg)
	if err == nil {
		n.Kill()
		t.Fatal("started on a data dir a newer llmgw wrote")
	}
	for _, want := range []string{"shards/shard-chat-0-v9.json (protocol " + fmt.Sprint(protocol.Max+1) + ")", "or later"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v; want it to say %q", err, want)
		}
	}
	if after, _ := os.ReadFile(dir.NodeFile()); !bytes.Equal(before, after) {
		t.Errorf("node.json changed from %s to %s", before, after)
	}
	if _, found, _ := dir.ReadRenewal(); found {
		t.Error("a renewal was noted")
	}
}
