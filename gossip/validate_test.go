package gossip

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/llmgw/llmgw/internal/clock"
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
	// As the previous release wrote it: without "protocol".
	b, err := json.Marshal(struct {
		FormatVersion int                `json:"format_version"`
		Deployments   []DeploymentRecord `json:"deployments"`
	}{1, recs})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, deploymentsFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A stamp further ahead of this node's clock than MaxClockOffset is
// refused, and the clock does not follow it: witnessed, it would make every
// later stamp of this node as wrong as the sender's clock.
func TestStampsFarAheadAreRefused(t *testing.T) {
	now := time.Now()
	a := startNode(t, "a", 0, "", func(c *Config) { c.Clock = clock.NewFake(now) })
	ahead := now.Add(MaxClockOffset + time.Second).UnixMilli()
	near := now.Add(MaxClockOffset - time.Second).UnixMilli()
	b, _ := encode(message{Deployments: []DeploymentRecord{depRecord("far", specNamed("far"), ahead), depRecord("near", specNamed("near"), near)}})
	a.receive(b, false)
	if _, ok := a.store.Deployment("far"); ok {
		t.Error("a stamp beyond the bound was taken in")
	}
	if _, ok := a.store.Deployment("near"); !ok {
		t.Error("a stamp within the bound was refused")
	}
	if got := a.Stats().Drops[DropStampAhead]; got != 1 {
		t.Errorf("stamps ahead counted %d, want 1", got)
	}
	if s := a.hlc.Now(); s.Wall >= ahead {
		t.Errorf("the clock followed the refused stamp: %v", s)
	}
}

// The logical counter carries into the wall time instead of wrapping to
// zero, which would issue a stamp older than the last one.
func TestHLCLogicalCounterNeverWraps(t *testing.T) {
	h := NewHLC("n1", clock.NewFake(time.UnixMilli(1000)))
	top := Stamp{Wall: 1000, Logical: ^uint32(0), Origin: "n2"}
	h.Witness(top)
	s := h.Now()
	if !top.Less(s) {
		t.Fatalf("%v issued after witnessing %v", s, top)
	}
	if s2 := h.Now(); !s.Less(s2) {
		t.Fatalf("%v then %v: went backwards", s, s2)
	}
}

// Boot epochs are Unix nanoseconds: one far ahead would make the node's
// real records older than a bogus one until the clocks catch up.
func TestEpochsFarAheadAreRefused(t *testing.T) {
	now := time.Now()
	a := startNode(t, "a", 0, "", func(c *Config) { c.Clock = clock.NewFake(now) })
	good := NodeRecord{Name: "peer", Version: Version{Epoch: now.UnixNano(), Seq: 1}, API: "127.0.0.1:2"}
	huge := NodeRecord{Name: "peer", Version: Version{Epoch: now.Add(time.Hour).UnixNano(), Seq: 1}, API: "127.0.0.1:3"}
	b, _ := encode(message{Nodes: []NodeRecord{good}})
	a.receive(b, false)
	b, _ = encode(message{Nodes: []NodeRecord{huge}, Beats: []Beat{{Name: "peer", Version: Version{Epoch: 1 << 62, Seq: 2}, Content: Version{Epoch: 1 << 62, Seq: 2}}}})
	a.receive(b, false)
	if ns, _ := a.store.Node("peer"); ns.Record.Version != good.Version {
		t.Errorf("peer's record is at %+v, want the good one %+v", ns.Record.Version, good.Version)
	}
	if got := a.Stats().Drops[DropEpochAhead]; got != 2 {
		t.Errorf("epochs ahead counted %d, want 2 (record and beat)", got)
	}
	// The epoch in memberlist's meta voids a node's older records: a huge
	// one would void them all.
	meta, _ := json.Marshal(nodeMeta{V: 1, Epoch: 1 << 62})
	a.setMember(&memberlist.Node{Name: "peer", Meta: meta}, StateAlive)
	for _, m := range a.Members() {
		if m.Name == "peer" && m.Epoch != 0 {
			t.Errorf("the meta epoch %d was taken", m.Epoch)
		}
	}
	if got := a.Stats().Drops[DropEpochAhead]; got != 3 {
		t.Errorf("epochs ahead counted %d, want 3 with the meta", got)
	}
}

// The file must never hold a stamp that lost: here the store holds a
// later stamp than the clock would issue (as when a peer's write lands in
// the moment between stamping and saving).
func TestLosingStampIsNeverSaved(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	a := startNode(t, "a", 0, dir, func(c *Config) { c.Clock = clock.NewFake(now) })
	later := depRecord("chat", specNamed("chat"), now.Add(10*time.Second).UnixMilli())
	later.Stamp.Origin = "b"
	a.store.MergeDeployment(later)
	spec := placement.Deployment{Name: "chat", Model: "new", Replicas: 1}
	rec, err := a.PutDeployment(spec)
	held, _ := a.store.Deployment("chat")
	b, rerr := os.ReadFile(filepath.Join(dir, deploymentsFile))
	if rerr != nil {
		t.Fatal(rerr)
	}
	var disk struct{ Deployments []DeploymentRecord }
	if err := json.Unmarshal(b, &disk); err != nil {
		t.Fatal(err)
	}
	if len(disk.Deployments) != 1 || disk.Deployments[0].Stamp != held.Stamp {
		t.Fatalf("the file holds %+v, the store %v: the file kept a stamp that lost", disk.Deployments, held.Stamp)
	}
	if err == nil && (held.Stamp != rec.Stamp || held.Spec.Model != "new") {
		t.Fatalf("the place was acknowledged with %v but the store holds %v", rec.Stamp, held.Stamp)
	}
}

// Node records are checked too: a shard's URL is where requests for it go,
// so it must point at its holder, and counts are bounded.
func TestNodeRecordsAreChecked(t *testing.T) {
	now := time.Now()
	rec := func(mut func(r *NodeRecord)) NodeRecord {
		r := NodeRecord{Name: "peer", Version: Version{Epoch: now.UnixNano(), Seq: 1}, API: "10.0.0.5:7070", Gossip: "10.0.1.5:7946",
			GPUs: gpus(2, "peer"),
			Shards: []ShardRecord{{ShardID: "chat-0", ReplicaID: "chat-0", Deployment: "chat", SpecVersion: "abc", GPUs: []int{0},
				Status: ShardReady, URL: "http://10.0.0.5:8100"}}}
		if mut != nil {
			mut(&r)
		}
		return r
	}
	good := []struct {
		why string
		r   NodeRecord
	}{
		{"engine at the API host", rec(nil)},
		{"engine at the gossip host", rec(func(r *NodeRecord) { r.Shards[0].URL = "http://10.0.1.5:8100" })},
		{"no engine URL yet", rec(func(r *NodeRecord) { r.Shards[0].URL = "" })},
		{"a gateway over HTTPS", rec(func(r *NodeRecord) { r.Gateway, r.GatewayTLS = "10.0.0.5:8000", true })},
		{"a gateway's rates", rec(func(r *NodeRecord) {
			r.Gateway, r.GatewayRates = "10.0.0.5:8000", map[string]float64{"chat": 23.5, "embed": 0}
		})},
		{"an idle gateway", rec(func(r *NodeRecord) { r.Gateway, r.GatewayRates = "10.0.0.5:8000", map[string]float64{} })},
		{"telemetry and a fault", rec(func(r *NodeRecord) {
			r.Probes = ProbeSummary{DriverFaultsRecent: 3, DriverFaultsBoot: 9, LastDriverFault: "NVRM: Check failed: Out of memory [NV_ERR_NO_MEMORY]"}
			r.Telemetry = Telemetry{GPUs: []GPUTelemetry{{Index: 0, UtilPct: 100, TempC: 58, PowerW: 690}, {Index: 1, NoPower: true}},
				Links: []LinkRate{{Device: "mlx5_0", Port: 1, Up: true, TxMBps: 12.5, RxMBps: 0.1}, {Device: "mlx5_1", Port: 1}}}
		})},
		{"a prefill replica and its KV port", rec(func(r *NodeRecord) {
			r.Shards[0].ShardID, r.Shards[0].ReplicaID, r.Shards[0].Role, r.Shards[0].KVPort = "chat-p0", "chat-p0", "prefill", 8998
		})},
		{"cached models", rec(func(r *NodeRecord) {
			r.CachedModels = []CachedModel{{Model: "meta-llama/Llama-3.1-8B", Bytes: 16 << 30}, {Model: "m.gguf"}}
		})},
	}
	bad := []struct {
		why, field string
		r          NodeRecord
	}{
		{"engine elsewhere", "url", rec(func(r *NodeRecord) { r.Shards[0].URL = "http://203.0.113.9:8100" })},
		{"engine at a wildcard", "url", rec(func(r *NodeRecord) { r.Shards[0].URL = "http://0.0.0.0:8100" })},
		{"engine URL not http", "url", rec(func(r *NodeRecord) { r.Shards[0].URL = "file:///etc/passwd" })},
		{"engine URL with credentials", "url", rec(func(r *NodeRecord) { r.Shards[0].URL = "http://u:p@10.0.0.5:8100" })},
		{"too many GPUs", "gpus", rec(func(r *NodeRecord) { r.GPUs = gpus(maxNodeGPUs+1, "peer") })},
		{"a GPU index twice", "gpus", rec(func(r *NodeRecord) { r.GPUs[1].Index = 0 })},
		{"too many shards", "shards", rec(func(r *NodeRecord) { r.Shards = make([]ShardRecord, maxNodeShards+1) })},
		{"a shard of no valid deployment", "deployment", rec(func(r *NodeRecord) { r.Shards[0].Deployment = "Chat!" })},
		{"a shard without an ID", "shard_id", rec(func(r *NodeRecord) { r.Shards[0].ShardID = "" })},
		{"a shard on too many GPUs", "gpus", rec(func(r *NodeRecord) { r.Shards[0].GPUs = make([]int, maxShardGPUs+1) })},
		{"a bad API address", "api", rec(func(r *NodeRecord) { r.API = "nowhere" })},
		{"a bad gateway address", "gateway", rec(func(r *NodeRecord) { r.Gateway = "nowhere" })},
		{"TLS on no gateway", "gateway_tls", rec(func(r *NodeRecord) { r.GatewayTLS = true })},
		{"rates of no gateway", "gateway_rates", rec(func(r *NodeRecord) { r.GatewayRates = map[string]float64{} })},
		{"a rate of no valid deployment", "gateway_rates", rec(func(r *NodeRecord) {
			r.Gateway, r.GatewayRates = "10.0.0.5:8000", map[string]float64{"Chat!": 1}
		})},
		{"a negative rate", "gateway_rates", rec(func(r *NodeRecord) {
			r.Gateway, r.GatewayRates = "10.0.0.5:8000", map[string]float64{"chat": -1}
		})},
		{"a NaN gateway rate", "gateway_rates", rec(func(r *NodeRecord) {
			r.Gateway, r.GatewayRates = "10.0.0.5:8000", map[string]float64{"chat": math.NaN()}
		})},
		{"too many gateway rates", "gateway_rates", rec(func(r *NodeRecord) {
			r.Gateway, r.GatewayRates = "10.0.0.5:8000", map[string]float64{}
			for i := range maxGatewayRates + 1 {
				r.GatewayRates[fmt.Sprint("d", i)] = 1
			}
		})},
		{"a target of no valid deployment", "scale", rec(func(r *NodeRecord) { r.Scale = []ScaleTarget{{Deployment: "Chat!", Replicas: 1}} })},
		{"a negative target", "scale", rec(func(r *NodeRecord) { r.Scale = []ScaleTarget{{Deployment: "chat", Replicas: -1}} })},
		{"a target above any spec", "scale", rec(func(r *NodeRecord) { r.Scale = []ScaleTarget{{Deployment: "chat", Replicas: maxScaleReplicas + 1}} })},
		{"a target's reason too long", "scale", rec(func(r *NodeRecord) {
			r.Scale = []ScaleTarget{{Deployment: "chat", Replicas: 1, Reason: strings.Repeat("x", maxScaleReason+1)}}
		})},
		{"a last request before 1970", "scale", rec(func(r *NodeRecord) { r.Scale = []ScaleTarget{{Deployment: "chat", Replicas: 1, LastRequest: -1}} })},
		{"a last request after 9999", "scale", rec(func(r *NodeRecord) { r.Scale = []ScaleTarget{{Deployment: "chat", Replicas: 1, LastRequest: 1 << 40}} })},
		{"a queue without a gateway", "gateway_queued", rec(func(r *NodeRecord) { r.Gateway, r.GatewayQueued = "", map[string]int{"chat": 1} })},
		{"a negative queue", "gateway_queued", rec(func(r *NodeRecord) { r.Gateway, r.GatewayQueued = "10.0.0.1:8000", map[string]int{"chat": -1} })},
		{"a queue of no valid deployment", "gateway_queued", rec(func(r *NodeRecord) { r.Gateway, r.GatewayQueued = "10.0.0.1:8000", map[string]int{"Chat!": 1} })},
		{"too many targets", "scale", rec(func(r *NodeRecord) { r.Scale = make([]ScaleTarget, maxScaleTargets+1) })},
		{"a negative fault count", "probes", rec(func(r *NodeRecord) { r.Probes.DriverFaultsRecent = -1 })},
		{"a role its replica ID does not name", "role", rec(func(r *NodeRecord) { r.Shards[0].Role = "prefill" })},
		{"a decode role on a prefill replica", "role", rec(func(r *NodeRecord) {
			r.Shards[0].ShardID, r.Shards[0].ReplicaID, r.Shards[0].Role = "chat-p0", "chat-p0", "decode"
		})},
		{"a KV port without a role", "kv_port", rec(func(r *NodeRecord) { r.Shards[0].KVPort = 8998 })},
		{"a KV port out of range", "kv_port", rec(func(r *NodeRecord) {
			r.Shards[0].ShardID, r.Shards[0].ReplicaID, r.Shards[0].Role, r.Shards[0].KVPort = "chat-p0", "chat-p0", "prefill", 70000
		})},
		{"a fault line with an escape", "last_driver_fault", rec(func(r *NodeRecord) { r.Probes.LastDriverFault = "NVRM: \x1b[2J" })},
		{"a fault line too long", "last_driver_fault", rec(func(r *NodeRecord) { r.Probes.LastDriverFault = strings.Repeat("x", MaxFaultLine+1) })},
		{"utilisation over 100%", "telemetry.gpus", rec(func(r *NodeRecord) { r.Telemetry.GPUs = []GPUTelemetry{{UtilPct: 101}} })},
		{"telemetry for a GPU twice", "telemetry.gpus", rec(func(r *NodeRecord) { r.Telemetry.GPUs = make([]GPUTelemetry, 2) })},
		{"a link named with a slash", "telemetry.links", rec(func(r *NodeRecord) { r.Telemetry.Links = []LinkRate{{Device: "../mlx5_0"}} })},
		{"a NaN rate", "telemetry.links", rec(func(r *NodeRecord) { r.Telemetry.Links = []LinkRate{{Device: "mlx5_0", TxMBps: math.NaN()}} })},
		{"too many links", "telemetry.links", rec(func(r *NodeRecord) {
			for i := range maxNodeLinks + 1 {
				r.Telemetry.Links = append(r.Telemetry.Links, LinkRate{Device: fmt.Sprint("mlx5_", i)})
			}
		})},
		{"too many cached models", "cached_models", rec(func(r *NodeRecord) {
			for i := range maxCachedModels + 1 {
				r.CachedModels = append(r.CachedModels, CachedModel{Model: fmt.Sprint("m", i)})
			}
		})},
		{"a cached model twice", "cached_models[1]", rec(func(r *NodeRecord) { r.CachedModels = []CachedModel{{Model: "a"}, {Model: "a"}} })},
		{"a cached model with a newline", "cached_models[0]", rec(func(r *NodeRecord) { r.CachedModels = []CachedModel{{Model: "a\nb"}} })},
		{"a cached model too long", "cached_models[0]", rec(func(r *NodeRecord) { r.CachedModels = []CachedModel{{Model: strings.Repeat("x", maxCachedName+1)}} })},
		{"too many labels", "labels", rec(func(r *NodeRecord) {
			r.Labels = map[string]string{}
			for i := range maxNodeLabels + 1 {
				r.Labels[fmt.Sprint("k", i)] = "v"
			}
		})},
	}
	for _, c := range good {
		if _, err := checkNode(c.r, now); err != nil {
			t.Errorf("%s: refused: %v", c.why, err)
		}
	}
	for _, c := range bad {
		reason, err := checkNode(c.r, now)
		if err == nil || reason != DropInvalidNode || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %s %v, want invalid_node naming %s", c.why, reason, err, c.field)
		}
	}
	// And through a live node: the bad record is refused and counted,
	// the good one in the same message is taken.
	a := startNode(t, "a", 0, "", nil)
	other := rec(nil)
	other.Name = "other"
	b, _ := encode(message{Nodes: []NodeRecord{bad[0].r, other}})
	a.receive(b, false)
	if _, ok := a.store.Node("peer"); ok {
		t.Error("a record whose engine URL points elsewhere was taken")
	}
	if _, ok := a.store.Node("other"); !ok {
		t.Error("the good record beside it was refused")
	}
	if got := a.Stats().Drops[DropInvalidNode]; got != 1 {
		t.Errorf("invalid node records counted %d, want 1", got)
	}
}

// This node's own record gets the checks its peers will apply, so a
// record they would refuse is an error here, not a silent absence there.
func TestOwnRecordPeersWouldRefuseIsAnError(t *testing.T) {
	a := startNode(t, "a", 0, "", nil)
	a.UpdateLocal(func(r *NodeRecord) {
		r.Shards = []ShardRecord{{ShardID: "chat-0", ReplicaID: "chat-0", Deployment: "chat", Status: ShardReady, URL: "http://0.0.0.0:8100"}}
	})
	if l := a.log.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "shards[0].url") {
		t.Fatalf("no error names the URL peers will refuse:\n%s", l)
	}
}
