package gateway

// A replica on another node costs a second hop: the gateway signs the
// request and sends it to the holder's relay, which checks it and passes it
// to the engine on loopback. BenchmarkGatewayRelay measures that hop beside
// the local route, in one run, as the other gateway benchmarks do:
//
//	go test -run '^$' -bench GatewayRelay -benchtime 10x -count 3 ./supervisor/gateway/
//
// Three paths to one fast upstream take turns (direct; through the gateway
// to a replica on its own node; through the gateway and the holder's relay),
// each window's order rotated. Per path: latency p50 and p99 and what the
// gateway, or the gateway and the relay, add to the direct path; and the
// process's CPU (user + system, getrusage) per request, the load generator
// and the upstream included, so the differences between the paths are the
// gateway's cost and the relay's.

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/hop"
	"github.com/llmgw/llmgw/placement"
)

// relayBench is one upstream reached three ways.
type relayBench struct {
	direct, local, relayed *benchPath
	close                  func()
}

// newRelayBench starts the upstream (answering with h), the holder's
// relay (on an API server of its own, as a node serves it) and two
// gateways: one that holds the replica itself, one on another node.
func newRelayBench(b *testing.B, h http.HandlerFunc) *relayBench {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"))
	})
	mux.HandleFunc("/v1/", h)
	up := httptest.NewServer(mux)
	port := up.Listener.Addr().(*net.TCPAddr).Port
	key := []byte("bench relay key")
	relay := NewRelay(RelayConfig{
		Verifier:  &hop.Verifier{Key: key, Now: time.Now},
		EngineKey: func(string) string { return "k" },
		Local: func(string) (LocalEngine, bool) {
			return LocalEngine{Port: port, MetricsPath: "/metrics"}, true
		},
	})
	apiMux := http.NewServeMux()
	apiMux.Handle(relay.Pattern(), relay)
	api := httptest.NewServer(apiMux)

	w := newWorld()
	w.ttl = time.Hour
	w.deploy(placement.Deployment{Name: "chat"})
	w.node("n1", gossip.StateAlive)
	w.node("n2", gossip.StateAlive)
	w.members["n2"].Record.API = api.Listener.Addr().String()
	w.hold(cp{dep: "chat", node: "n2", url: fmt.Sprintf("http://192.0.2.1:%d", port), private: true})
	serve := func(self string) (*Gateway, *httptest.Server) {
		gw := New(Config{Relay: &hop.Signer{Name: self, Key: key, Now: time.Now}})
		gw.Update(w.snapshotOf(self, time.Now()))
		gs := httptest.NewUnstartedServer(gw)
		gs.Config = newHTTPServer(gw, nil)
		gs.Start()
		return gw, gs
	}
	localGW, localSrv := serve("n2")   // holds the replica: dials 127.0.0.1
	remoteGW, remoteSrv := serve("n1") // another node: through n2's relay
	if r := remoteGW.routing.Load().routes["chat"][0]; r.Relay == "" {
		b.Fatalf("n1's route %+v does not go through the relay", r.Route)
	}
	p := &relayBench{direct: newBenchPath(up.URL), local: newBenchPath(localSrv.URL), relayed: newBenchPath(remoteSrv.URL)}
	p.close = func() {
		for _, pt := range []*benchPath{p.direct, p.local, p.relayed} {
			pt.tr.CloseIdleConnections()
		}
		localSrv.Close()
		remoteSrv.Close()
		_ = localGW.Shutdown(b.Context())
		_ = remoteGW.Shutdown(b.Context())
		api.Close()
		up.Close()
	}
	return p
}

// cpuNow is the process's CPU time so far, user and system.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// threeWay runs windows of d on the three paths, in an order that rotates
// with each window, after a warm-up on each; it returns each path's stats
// and CPU time.
func threeWay(b *testing.B, p *relayBench, windows int, d time.Duration, window func(*benchPath, time.Duration, *pathStats) error) (stats [3]*pathStats, cpu [3]time.Duration) {
	paths := []*benchPath{p.direct, p.local, p.relayed}
	var warm pathStats
	for _, pt := range paths {
		if err := window(pt, 50*time.Millisecond, &warm); err != nil {
			b.Fatal(err)
		}
	}
	for i := range stats {
		stats[i] = &pathStats{}
	}
	b.ResetTimer()
	k := 0
	for range b.N {
		for range windows {
			for j := range 3 {
				i := (k + j) % 3
				c0 := cpuNow()
				if err := window(paths[i], d, stats[i]); err != nil {
					b.Fatal(err)
				}
				cpu[i] += cpuNow() - c0
			}
			k++
		}
	}
	b.StopTimer()
	return stats, cpu
}

// reportThree reports latency percentiles, what the local gateway and the
// relayed one add to the direct path, the relay's own addition over the
// local gateway, and CPU per request, in µs.
func reportThree(b *testing.B, name string, lat [3][]time.Duration, stats [3]*pathStats, cpu [3]time.Duration) {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	for _, q := range []struct {
		name string
		q    float64
	}{{"p50", .5}, {"p99", .99}} {
		d, l, r := pct(lat[0], q.q), pct(lat[1], q.q), pct(lat[2], q.q)
		b.ReportMetric(us(d), fmt.Sprintf("direct-%s%s-µs", name, q.name))
		b.ReportMetric(us(l-d), fmt.Sprintf("local-added-%s%s-µs", name, q.name))
		b.ReportMetric(us(r-d), fmt.Sprintf("relayed-added-%s%s-µs", name, q.name))
		b.ReportMetric(us(r-l), fmt.Sprintf("relay-hop-%s%s-µs", name, q.name))
	}
	per := func(i int) float64 { return us(cpu[i]) / float64(max(stats[i].done, 1)) }
	b.ReportMetric(per(0), "direct-cpu-µs/req")
	b.ReportMetric(per(1), "local-cpu-µs/req")
	b.ReportMetric(per(2), "relayed-cpu-µs/req")
	b.ReportMetric(per(2)-per(1), "relay-hop-cpu-µs/req")
	b.ReportMetric(stats[2].rate()/stats[1].rate(), "relayed/local-throughput")
}

// BenchmarkGatewayRelay: 1,000 plain requests/s, open loop, and 100
// streams, closed loop, on the three paths.
func BenchmarkGatewayRelay(b *testing.B) {
	b.Run("open-loop/prompt=1KB", func(b *testing.B) {
		p := newRelayBench(b, fixedChat)
		defer p.close()
		body := promptBody(1<<10, false)
		stats, cpu := threeWay(b, p, 2, benchWindow/2, func(pt *benchPath, d time.Duration, s *pathStats) error {
			return openLoop(pt, body, d, s)
		})
		reportThree(b, "", [3][]time.Duration{stats[0].lat, stats[1].lat, stats[2].lat}, stats, cpu)
	})
	b.Run("streams/prompt=1KB", func(b *testing.B) {
		p := newRelayBench(b, fixedStream)
		defer p.close()
		body := promptBody(1<<10, true)
		stats, cpu := threeWay(b, p, 1, benchWindow, func(pt *benchPath, d time.Duration, s *pathStats) error {
			return closedLoop(pt, body, d, s)
		})
		reportThree(b, "ttfb-", [3][]time.Duration{stats[0].ttfb, stats[1].ttfb, stats[2].ttfb}, stats, cpu)
		b.ReportMetric(stats[1].rate(), "local-streams/s")
		b.ReportMetric(stats[2].rate(), "relayed-streams/s")
	})
}
