package gossip

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/llmgw/llmgw/placement"
)

// benchState is a push/pull's worth of state: n node records of 8 GPUs
// and 16 serving shards each, and deps deployments, at record version seq.
func benchState(n, deps int, seq uint64) message {
	epoch := time.Now().Add(-time.Hour).UnixNano()
	var m message
	for i := range n {
		name := fmt.Sprintf("n%02d", i)
		r := NodeRecord{Name: name, Version: Version{Epoch: epoch, Seq: seq}, Content: Version{Epoch: epoch, Seq: seq},
			API: "127.0.0.1:1", Gossip: "127.0.0.1:2", Gateway: "127.0.0.1:3", GatewayRates: map[string]float64{"chat": 1.5},
			GPUs: gpus(8, name), AgentVersion: "bench", StartedAt: time.Unix(1700000000, 0).UTC()}
		for j := range 16 {
			r.Shards = append(r.Shards, ShardRecord{ShardID: fmt.Sprintf("d%d-%d", j, i), ReplicaID: fmt.Sprintf("d%d-%d", j, i),
				Deployment: fmt.Sprintf("d%d", j), SpecVersion: "0123456789ab", GPUs: []int{j % 8}, Status: ShardReady, Ready: true,
				ClaimStamp: int64(j), URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+j), PID: 1000 + j,
				Load: ShardLoad{Running: 3, Waiting: 1, KVCacheUsage: 0.4, RatesValid: true}})
		}
		m.Nodes = append(m.Nodes, r)
	}
	for j := range deps {
		name := fmt.Sprintf("d%d", j)
		m.Deployments = append(m.Deployments, DeploymentRecord{Name: name, Spec: &placement.Deployment{Name: name, Model: "org/model-" + name, Replicas: 50,
			Args: []string{"--max-model-len", "8192"}, Labels: map[string]string{"zone": "a"}}, Stamp: Stamp{Wall: 1700000000000 + int64(j), Origin: "n00"}})
	}
	return m
}

// BenchmarkFullState50 measures one push/pull of a 50-node cluster: the
// receiving side (decode, checks, merge of every record, newer each time)
// and the sending side (LocalState), with what the store holds once it
// took the state in (held-B, retained heap).
func BenchmarkFullState50(b *testing.B) {
	b.Run("receive", func(b *testing.B) {
		a := startNode(b, "self", 0, "", nil)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			msg, err := encode(benchState(50, 20, uint64(i+1)))
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			a.receive(msg, false)
		}
		b.StopTimer()
		if got := len(a.store.Nodes()); got != 51 {
			b.Fatalf("the store holds %d nodes, want 51: the state was refused (%v)", got, a.Stats().Drops)
		}
	})
	b.Run("local_state", func(b *testing.B) {
		a := startNode(b, "self", 0, "", nil)
		msg, err := encode(benchState(50, 20, 1))
		if err != nil {
			b.Fatal(err)
		}
		// Twice: a cycle's finalizers (memberlist's) free only at the next.
		var before, after runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&before)
		a.receive(msg, false)
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&after)
		held := float64(after.HeapAlloc) - float64(before.HeapAlloc)
		if got := len(a.store.Nodes()); got != 51 {
			b.Fatalf("the store holds %d nodes, want 51: the state was refused (%v)", got, a.Stats().Drops)
		}
		d := &delegate{c: a.Cluster}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if len(d.LocalState(false)) == 0 {
				b.Fatal("no state")
			}
		}
		b.ReportMetric(held, "held-B")
	})
}

// BenchmarkEncodeBeat is the cost of the message every node sends and
// relays most often: one beat.
func BenchmarkEncodeBeat(b *testing.B) {
	m := message{Beats: []Beat{{Name: "node-123", Version: Version{Epoch: time.Now().UnixNano(), Seq: 4711}, Content: Version{Epoch: time.Now().UnixNano(), Seq: 4700}}}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encode(m); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReceiveBeat is what one renewal costs its receiver in llmgw's
// code, from the bytes memberlist hands over to the merged renewal (the
// copy check, inflate, decode, checks, merge): a node receives N/3.3 of
// them a second, once each since beats go straight to every member.
// memberlist's own part (the read, decryption) is not in it.
func BenchmarkReceiveBeat(b *testing.B) {
	c := startNode(b, "a", 0, "", func(c *Config) { c.BeatQuiet = 5 * time.Second })
	rec := NodeRecord{Name: "peer", Version: Version{Epoch: time.Now().UnixNano(), Seq: 1}, API: "127.0.0.1:2"}
	c.store.MergeNode(rec)
	d := &delegate{c: c.Cluster}
	// Encoded beforehand: every beat is a new one, as on the wire.
	msgs := make([][]byte, b.N)
	for i := range msgs {
		msg, err := encode(message{Beats: []Beat{{Name: "peer", Version: Version{Epoch: rec.Version.Epoch, Seq: uint64(i + 2)}, Content: rec.Version}}, From: "peer"})
		if err != nil {
			b.Fatal(err)
		}
		msgs[i] = msg
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		d.NotifyMsg(msgs[i])
	}
	b.StopTimer()
	if ns, _ := c.store.Node("peer"); ns.Record.Version.Seq != uint64(b.N+1) {
		b.Fatalf("the last beat was not taken: at seq %d, sent %d", ns.Record.Version.Seq, b.N+1)
	}
}
