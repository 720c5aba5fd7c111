package gossip

import (
	"bytes"
	"compress/flate"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/testwait"
)

// inflate is the JSON envelope of wire message b.
func inflate(t testing.TB, b []byte) []byte {
	t.Helper()
	if len(b) == 0 || b[0] != formatDeflateJSON {
		t.Fatalf("not a wire message: %q", b)
	}
	out, err := io.ReadAll(flate.NewReader(bytes.NewReader(b[1:])))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A later release may change a field's type (a number becomes an object).
// A record this build cannot decode costs that record alone, counted
// under its own reason: the rest of the message is taken, or every older
// node would be blind to each push/pull that holds one.
func TestOneUndecodableRecordCostsOnlyItself(t *testing.T) {
	a := startNode(t, "a", 0, "", nil)
	now := time.Now()
	env := fmt.Sprintf(`{"nodes":[
		{"name":"future","version":{"epoch":%[1]d,"seq":1},"api":"127.0.0.1:3","gpus":{"count":8}},
		{"name":"peer","version":{"epoch":%[1]d,"seq":1},"api":"127.0.0.1:2"}],
	"deployments":[
		{"name":"later","spec":{"name":"later","model":"m","replicas":{"min":1}},"stamp":{"wall":%[2]d,"origin":"n1"}},
		{"name":"good","spec":{"name":"good","model":"m","replicas":1},"stamp":{"wall":%[2]d,"origin":"n1"}}],
	"beats":[{"name":"peer","version":"2"}]}`, now.UnixNano(), now.UnixMilli())
	a.receive(deflated(t, env), false)
	if _, ok := a.store.Node("peer"); !ok {
		t.Error("the good node record was dropped with the one that did not decode")
	}
	if _, ok := a.store.Deployment("good"); !ok {
		t.Error("the good deployment was dropped with the one that did not decode")
	}
	if _, ok := a.store.Node("future"); ok {
		t.Error("a node record that did not decode was taken in")
	}
	if _, ok := a.store.Deployment("later"); ok {
		t.Error("a deployment record that did not decode was taken in")
	}
	st := a.Stats()
	if got := st.Drops[DropMalformedRecord]; got != 3 {
		t.Errorf("records that did not decode counted %d, want 3 (%v)", got, st.Drops)
	}
	if st.Dropped != 0 || st.Drops[DropMalformed] != 0 {
		t.Errorf("%d whole messages dropped, want 0: only records were bad", st.Dropped)
	}
	if l := a.log.String(); !strings.Contains(l, `node \"future\"`) || !strings.Contains(l, `deployment \"later\"`) || !strings.Contains(l, "malformed_record") {
		t.Errorf("the log does not name the records that did not decode:\n%s", l)
	}
}

// A field a later release adds, which this build does not decode, passes
// a node of this build unchanged: in the records it relays, in push/pull,
// in deployments.json and back, and to a peer over the network. A record
// whose known fields fail the checks is still refused.
func TestUnknownFieldsSurviveThisNode(t *testing.T) {
	dirA := t.TempDir()
	a := startNode(t, "a", 0, dirA, nil)
	now := time.Now()
	nodeRaw := fmt.Sprintf(`{"name":"peer","version":{"epoch":%d,"seq":1},"content":{"epoch":0,"seq":0},"api":"127.0.0.1:2","gossip":"127.0.0.1:3",`+
		`"gateway_rates":null,"gpus":[{"index":0,"uuid":"GPU-1","name":"H100","memory_total_bytes":1,"future_gpu_field":[1,2]}],`+
		`"agent_version":"v9","started_at":"2025-01-01T00:00:00Z","future_field":{"x":1}}`, now.UnixNano())
	depRaw := fmt.Sprintf(`{"name":"chat","spec":{"name":"chat","model":"m","replicas":1,"future_spec_field":"7m"},"stamp":{"wall":%d,"logical":0,"origin":"n1"},"future_field":{"x":1}}`, now.UnixMilli())
	invalid := fmt.Sprintf(`{"name":"bad","spec":{"name":"bad","model":"m","replicas":-1,"future_spec_field":"7m"},"stamp":{"wall":%d,"origin":"n1"},"future_field":{"x":1}}`, now.UnixMilli())
	a.receive(deflated(t, `{"nodes":[`+nodeRaw+`],"deployments":[`+depRaw+`,`+invalid+`]}`), true)

	if _, ok := a.store.Deployment("bad"); ok || a.Stats().Drops[DropInvalidDeployment] != 1 {
		t.Errorf("a record with unknown fields whose known fields fail the checks was taken in (drops %v)", a.Stats().Drops)
	}
	holds := func(where string, env []byte) {
		t.Helper()
		if !bytes.Contains(env, []byte(nodeRaw)) || !bytes.Contains(env, []byte(depRaw)) {
			t.Errorf("%s does not carry the records as they came:\n%s", where, env)
		}
	}
	// Relayed as gossip (nobody else is in the cluster to take the
	// broadcasts, so they wait in the queue).
	var relayed []byte
	for _, b := range a.queue.GetBroadcasts(0, 1<<20) {
		relayed = append(relayed, inflate(t, b)...)
	}
	holds("the relay", relayed)
	// Push/pull.
	holds("push/pull", inflate(t, (&delegate{c: a.Cluster}).LocalState(false)))
	// deployments.json, and back.
	if err := a.Shutdown(); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(filepath.Join(dirA, deploymentsFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(file, []byte(`"future_spec_field": "7m"`)) || !bytes.Contains(file, []byte(`"future_field": {`)) {
		t.Errorf("deployments.json lost the unknown fields:\n%s", file)
	}
	a2 := startNode(t, "a", 0, dirA, nil)
	if got := a2.store.depEntries(); len(got) != 1 || string(got[0].raw) != depRaw {
		t.Fatalf("after a restart the record is kept in\n%s\nwant\n%s", got[0].raw, depRaw)
	}
	// The node record is not persisted (its owner sends it again); give
	// it back to a2, then a peer learns both by push/pull.
	a2.receive(deflated(t, `{"nodes":[`+nodeRaw+`]}`), false)
	b := startNode(t, "b", 0, "", nil)
	mustJoin(t, b, a2)
	testwait.Until(t, 10*time.Second, "b holds both records in their bytes", func() (bool, string) {
		env := inflate(t, (&delegate{c: b.Cluster}).LocalState(false))
		return bytes.Contains(env, []byte(nodeRaw)) && bytes.Contains(env, []byte(depRaw)), string(env)
	})
}

// A record is kept and relayed with the fields this build does not know,
// which no check bounds: a record larger than maxRecordBytes is dropped
// alone, or a peer could make every node hold and resend a field of any
// size.
func TestARecordBeyondTheBoundIsDroppedAlone(t *testing.T) {
	huge := `{"name":"huge","version":{"epoch":1,"seq":1},"future_field":"` + strings.Repeat("x", maxRecordBytes) + `"}`
	good := `{"name":"good","version":{"epoch":1,"seq":1}}`
	m, err := decode(deflated(t, `{"nodes":[`+huge+`,`+good+`],"deployments":[`+strings.Replace(huge, `"version"`, `"stamp"`, 1)+`]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Nodes) != 1 || m.Nodes[0].Name != "good" {
		t.Errorf("decoded nodes %d, want the good one alone", len(m.Nodes))
	}
	if len(m.bad) != 2 || !strings.Contains(m.bad[0].err.Error(), "more than a record may have") || !strings.Contains(m.bad[0].what, `"huge"`) {
		t.Errorf("bad records %d (%v), want the two huge ones, named, saying why", len(m.bad), m.bad)
	}
}
