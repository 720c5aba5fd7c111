package supervisor

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
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
