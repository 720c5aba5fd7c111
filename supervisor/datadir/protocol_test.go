package datadir

import (
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/protocol"
)

// oldDataDir copies the data dir 9f0749d's own writers wrote (node.json,
// renewal.json, one shard state file), the release before files said their
// protocol, into a temp dir.
func oldDataDir(t *testing.T) Dir {
	t.Helper()
	d := New(t.TempDir())
	for src, dst := range map[string]string{
		"testdata/9f0749d/node.json":                                    d.NodeFile(),
		"testdata/9f0749d/renewal.json":                                 d.RenewalFile(),
		"../shardstate/testdata/9f0749d/shard-chat-0-abc123def456.json": filepath.Join(d.ShardsDir(), "shard-chat-0-abc123def456.json"),
	} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// The previous release's files carry no "protocol": they read as protocol
// 1, every field as it was, and pass the start-up check.
func TestPreviousReleasesFilesRead(t *testing.T) {
	d := oldDataDir(t)
	if err := d.CheckProtocol(); err != nil {
		t.Fatalf("CheckProtocol refuses the previous release's data dir: %v", err)
	}
	id, found, err := d.ReadIdentity()
	want := Identity{Protocol: protocol.V1, Name: "gpu-1", Epoch: 1767322800000000000, Peers: []string{"10.0.0.2:7946", "10.0.0.3:7946"}}
	if err != nil || !found || !reflect.DeepEqual(id, want) {
		t.Fatalf("ReadIdentity = %+v, %v, %v; want %+v", id, found, err, want)
	}
	at, found, err := d.ReadRenewal()
	if err != nil || !found || !at.Equal(time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)) {
		t.Fatalf("ReadRenewal = %v, %v, %v", at, found, err)
	}
	states, bad := d.ReadShardStates()
	if len(bad) != 0 || len(states) != 1 || states[0].Protocol != protocol.V1 || states[0].PID != 4242 || states[0].Gang == nil {
		t.Fatalf("ReadShardStates = %+v, bad %v", states, bad)
	}
}

// What this release writes says protocol 2, and reads back so.
func TestFilesWrittenSayTheirProtocol(t *testing.T) {
	d := New(t.TempDir())
	if err := d.WriteIdentity(Identity{Name: "n1", Epoch: 1, ActiveVersion: 2}); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteRenewal(time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{d.NodeFile(), d.RenewalFile()} {
		b, _ := os.ReadFile(p)
		if !strings.Contains(string(b), `"protocol":2`) && !strings.Contains(string(b), `"protocol": 2`) {
			t.Errorf("%s = %s; want \"protocol\": 2", filepath.Base(p), b)
		}
	}
	id, _, err := d.ReadIdentity()
	if err != nil || id.Protocol != protocol.V2 || id.ActiveVersion != 2 {
		t.Fatalf("ReadIdentity = %+v, %v", id, err)
	}
	// A node that never saw an active version writes no field for it,
	// as the previous release's node.json had none.
	if err := d.WriteIdentity(Identity{Name: "n1", Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(d.NodeFile()); strings.Contains(string(b), "active_version") {
		t.Errorf("node.json = %s; want no active_version", b)
	}
}

// A file an llmgw of a newer protocol wrote stops the start-up check,
// which names the file, its protocol, this build's range and the fix, and
// changes nothing; the viewers' readers say the same of their file and
// change nothing either.
func TestNewerProtocolIsRefused(t *testing.T) {
	above := protocol.Max + 1
	for _, c := range []struct {
		file    func(Dir) string
		content string
		// read is the viewers' reader of the file; nil for gossip's
		// deployments.json, which gossip reads.
		read func(Dir) error
	}{
		{Dir.NodeFile, `{"protocol":` + strconv.Itoa(above) + `,"name":"gpu-1","epoch":5}`, func(d Dir) error { _, _, err := d.ReadIdentity(); return err }},
		{Dir.RenewalFile, `{"protocol":` + strconv.Itoa(above) + `,"renewed_at":"2026-01-02T03:04:05Z"}`, func(d Dir) error { _, _, err := d.ReadRenewal(); return err }},
		{Dir.DeploymentsFile, `{"protocol":` + strconv.Itoa(above) + `,"deployments":[]}`, nil},
		{func(d Dir) string { return filepath.Join(d.ShardsDir(), "shard-chat-0-v9.json") },
			`{"protocol":` + strconv.Itoa(above) + `,"format_version":1,"shard_id":"chat-0","spec":{"engine_id":"chat-0-v9"}}`,
			func(d Dir) error {
				if _, bad := d.ReadShardStates(); len(bad) == 1 {
					return bad[0]
				}
				return nil
			}},
	} {
		d := oldDataDir(t)
		p := c.file(d)
		t.Run(filepath.Base(p), func(t *testing.T) {
			if err := os.WriteFile(p, []byte(c.content), 0o600); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, d.Root())
			err := d.CheckProtocol()
			rel, _ := filepath.Rel(d.Root(), p)
			for _, want := range []string{rel + " (protocol " + strconv.Itoa(above) + ")", "speaks protocols 1 to " + strconv.Itoa(protocol.Max),
				"Install an llmgw that speaks protocol " + strconv.Itoa(above) + " or later", "changed nothing"} {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("CheckProtocol = %v; want it to say %q", err, want)
				}
			}
			if c.read != nil {
				if rerr := c.read(d); rerr == nil || !strings.Contains(rerr.Error(), "protocol "+strconv.Itoa(above)) {
					t.Errorf("reader: %v; want it to name protocol %d", rerr, above)
				}
			}
			if after := snapshot(t, d.Root()); !reflect.DeepEqual(before, after) {
				t.Errorf("the data dir changed:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// Protocols this build speaks pass; a file that does not parse is its
// reader's to report, not the check's.
func TestCheckProtocolPassesWhatThisBuildSpeaks(t *testing.T) {
	d := oldDataDir(t)
	if err := d.WriteIdentity(Identity{Name: "gpu-1", Epoch: 6}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.DeploymentsFile(), []byte(`{"protocol":`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.ShardsDir(), "shard-x-0.json.corrupt-1"), []byte(`{"protocol":99}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.CheckProtocol(); err != nil {
		t.Fatalf("CheckProtocol = %v", err)
	}
	if err := New(filepath.Join(t.TempDir(), "none")).CheckProtocol(); err != nil {
		t.Fatalf("CheckProtocol of a missing dir = %v", err)
	}
}

// snapshot is every file under root with its content.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		out[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
