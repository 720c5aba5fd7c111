// Package nodemetrics serves a node's Prometheus metrics at /metrics.
//
// Every value is read from the node when Prometheus scrapes: there are no
// counters to keep in step with the node's state, and a scrape shows the
// state as it is. The metrics live in a registry of their own, so nothing
// here depends on (or adds to) client_golang's global one, and two nodes in
// one process (tests, the demo) do not collide.
//
// Cluster-wide gauges (members, deployments, shards) are this node's view of
// the cluster, which every node shares once gossip converged: aggregate them
// across nodes with max, not sum. Per-node values (GPUs, this node's
// engines, gossip traffic, reconcile time) carry no node label; Prometheus
// adds the instance.
package nodemetrics

import (
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// Options add what the node itself does not expose.
type Options struct {
	// ScrapeErrors counts failed engine /metrics scrapes on this node
	// (engine.Runner.ScrapeErrors). Nil: the metric is left out.
	ScrapeErrors func() uint64
	// Collectors are registered too, e.g. the MCP server's tool-call
	// durations (*mcpserver.Server).
	Collectors []prometheus.Collector
	// NoProcessMetrics leaves out the Go runtime and process collectors.
	NoProcessMetrics bool
}

// Source is what the metrics are read from (*supervisor.Node): the node's
// read model, its clock, and its gossip traffic counters.
type Source interface {
	Status() *status.Snapshot
	Now() time.Time
	GossipStats() gossip.Stats
}

// Register adds GET /metrics to mux and returns the registry behind it.
func Register(n Source, mux *http.ServeMux, opts Options) *prometheus.Registry {
	reg := NewRegistry(n, opts)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Registry:            reg,
	}))
	return reg
}

// NewRegistry builds the node's registry without serving it.
func NewRegistry(n Source, opts Options) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(&nodeCollector{n: n, scrapeErrors: opts.ScrapeErrors})
	if !opts.NoProcessMetrics {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	for _, c := range opts.Collectors {
		reg.MustRegister(c)
	}
	return reg
}

var (
	descMembers = prometheus.NewDesc("llmgw_members",
		"Nodes this node knows, by memberlist state (alive, suspect, dead, left, unknown), and refused: their build cannot speak this node's cluster version.", []string{"state"}, nil)
	descDeployments = prometheus.NewDesc("llmgw_deployments",
		"Deployments the cluster is asked to run (tombstones excluded).", nil, nil)
	descReplicas = prometheus.NewDesc("llmgw_deployment_replicas",
		"Replicas of each deployment: wanted (the spec's, or an autoscaled deployment's target in force), placed (in the plan), ready (every shard holds a valid lease); min and max bound an autoscaled deployment's target.",
		[]string{"deployment", "kind"}, nil)
	descShards = prometheus.NewDesc("llmgw_shards",
		"Shards in this node's view by engine status (pending, starting, ready, crashed, backoff, stopping, unplaced) and lease (starting, valid, lapsed, none).",
		[]string{"status", "lease"}, nil)
	descReconcile = prometheus.NewDesc("llmgw_reconcile_duration_seconds",
		"How long this node's last reconcile pass took (plan, then engines).", nil, nil)
	descReconciles = prometheus.NewDesc("llmgw_reconciles_total",
		"Reconcile passes of this node's control loop.", nil, nil)
	descPlans = prometheus.NewDesc("llmgw_plans_total",
		"Plans this node's passes needed: computed (placement ran), or skipped (nothing placement reads had changed since the last plan, which was kept).", []string{"result"}, nil)
	descGossipBytes = prometheus.NewDesc("llmgw_gossip_bytes_total",
		"Bytes of this node's gossip messages (memberlist's own probes excepted), by direction (in, out) and way (gossip: broadcasts, and direct messages on the way in; direct: records sent to one member; push_pull: whole-state exchanges).", []string{"direction", "way"}, nil)
	descGossipRecords = prometheus.NewDesc("llmgw_gossip_records_received_total",
		"Records this node received by kind (node, beat, deployment), news or not.", []string{"kind"}, nil)
	descGossipDuplicates = prometheus.NewDesc("llmgw_gossip_duplicates_total",
		"Gossip messages this node dropped unread: copies of one it had taken already (memberlist retransmits every broadcast from every relaying node).", nil, nil)
	descGossip = prometheus.NewDesc("llmgw_gossip_messages_total",
		"Gossip messages of this node: sent, received, and dropped (undecodable or refused).", []string{"direction"}, nil)
	descGossipDrops = prometheus.NewDesc("llmgw_gossip_dropped_total",
		"Gossip records this node refused, by reason (gossip.DropReasons): malformed messages, and records that fail the checks a local write gets.",
		[]string{"reason"}, nil)
	descClockOffset = prometheus.NewDesc("llmgw_clock_offset_seconds",
		"This node's clock minus the cluster's (the median of its own and its peers' clocks, estimated from gossip probes); absent until a peer was probed. Its writes are refused beyond ±"+gossip.MaxClockOffset.String()+".",
		nil, nil)
	descTokenMismatch = prometheus.NewDesc("llmgw_gossip_token_mismatch_peers",
		"Members announcing another cluster token's fingerprint: API calls between them and this node are refused.", nil, nil)
	descGossipMembers = prometheus.NewDesc("llmgw_gossip_memberlist_members",
		"Members memberlist counts as alive or suspect, this node included.", nil, nil)
	descGPUTotal = prometheus.NewDesc("llmgw_gpu_memory_total_bytes",
		"This node's GPU memory, per GPU.", []string{"gpu", "uuid", "model"}, nil)
	descGPUUsed = prometheus.NewDesc("llmgw_gpu_memory_used_bytes",
		"GPU memory in use as the driver reports it, per GPU.", []string{"gpu", "uuid"}, nil)
	descGPUForeign = prometheus.NewDesc("llmgw_gpu_memory_foreign_bytes",
		"GPU memory held by processes llmgw does not own, per GPU; placement fits around it.", []string{"gpu", "uuid"}, nil)
	descGPUFaulted = prometheus.NewDesc("llmgw_gpu_faulted",
		"1 when this node saw recent driver faults (Xid) on the GPU; placement puts nothing new on it.", []string{"gpu", "uuid"}, nil)
	descDriverFaults = prometheus.NewDesc("llmgw_driver_faults",
		"NVIDIA driver (NVRM/Xid) lines in this node's kernel log: recent (the probe's window) and boot (since boot).",
		[]string{"window"}, nil)
	descEngineRunning = prometheus.NewDesc("llmgw_engine_requests_running",
		"Requests an engine on this node is running, as last scraped.", []string{"shard", "deployment"}, nil)
	descEngineWaiting = prometheus.NewDesc("llmgw_engine_requests_waiting",
		"Requests waiting in an engine on this node, as last scraped.", []string{"shard", "deployment"}, nil)
	descEngineKV = prometheus.NewDesc("llmgw_engine_kv_cache_usage_ratio",
		"KV-cache usage (0-1) of an engine on this node, as last scraped.", []string{"shard", "deployment"}, nil)
	descEngineTPS = prometheus.NewDesc("llmgw_engine_tokens_per_second",
		"Token rate of an engine on this node between its last two scrapes (only while the rates are valid).",
		[]string{"shard", "deployment", "kind"}, nil)
	descEngineRestarts = prometheus.NewDesc("llmgw_engine_restarts",
		"Times the engine of a shard on this node was restarted after it exited.", []string{"shard", "deployment"}, nil)
	descEngineScrapeFailing = prometheus.NewDesc("llmgw_engine_scrape_failing",
		"1 when the last /metrics scrape of an engine on this node failed.", []string{"shard", "deployment"}, nil)
	descScrapeErrors = prometheus.NewDesc("llmgw_engine_scrape_errors_total",
		"Failed engine /metrics scrapes on this node.", nil, nil)
	descIsolated = prometheus.NewDesc("llmgw_isolated",
		"1 while this node hears no peer although it expects some: its shards' leases lapse in the other nodes' views within the lease TTL.", nil, nil)
	descClusterVersion = prometheus.NewDesc("llmgw_cluster_version",
		"The cluster protocol version this node runs at (its active version): the highest every member speaks. It never goes down.", nil, nil)
	descProtocolVersion = prometheus.NewDesc("llmgw_protocol_version",
		"The protocol versions this node's build speaks: its lowest (bound=min) and highest (bound=max).", []string{"bound"}, nil)
	descVersionsMixed = prometheus.NewDesc("llmgw_versions_mixed",
		"1 while live members announce different protocol versions: an upgrade under way, or one left half done.", nil, nil)
)

// nodeCollector reads everything from the node at scrape time.
type nodeCollector struct {
	n            Source
	scrapeErrors func() uint64
}

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMembers, descDeployments, descReplicas, descShards, descReconcile, descReconciles, descPlans, descGossipBytes, descGossipRecords, descGossipDuplicates, descGossip,
		descGossipDrops, descClockOffset, descTokenMismatch, descGossipMembers, descGPUTotal, descGPUUsed, descGPUForeign, descGPUFaulted, descDriverFaults, descEngineRunning,
		descEngineWaiting, descEngineKV, descEngineTPS, descEngineRestarts, descEngineScrapeFailing} {
		ch <- d
	}
	ch <- descIsolated
	ch <- descClusterVersion
	ch <- descProtocolVersion
	ch <- descVersionsMixed
	if c.scrapeErrors != nil {
		ch <- descScrapeErrors
	}
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	snap, now := c.n.Status(), c.n.Now()
	// Every state appears, at 0 when empty, so a vanished series is never
	// mistaken for a count that went to zero.
	members := map[gossip.MemberState]int{gossip.StateAlive: 0, gossip.StateSuspect: 0, gossip.StateDead: 0, gossip.StateLeft: 0, gossip.StateUnknown: 0,
		gossip.StateRefused: 0}
	all := snap.Members()
	for _, m := range all {
		members[m.State]++
	}
	for s, v := range members {
		gauge(ch, descMembers, float64(v), string(s))
	}

	deps := snap.Deployments(now)
	gauge(ch, descDeployments, float64(len(deps)))
	for _, d := range deps {
		gauge(ch, descReplicas, float64(d.Replicas), d.Name, "wanted")
		gauge(ch, descReplicas, float64(d.Placed), d.Name, "placed")
		gauge(ch, descReplicas, float64(d.Ready), d.Name, "ready")
		if a := d.Autoscale; a != nil {
			gauge(ch, descReplicas, float64(a.Min), d.Name, "min")
			gauge(ch, descReplicas, float64(a.Max), d.Name, "max")
		}
	}

	type sl struct{ status, lease string }
	shards := map[sl]int{}
	for _, s := range snap.Shards(now) {
		shards[sl{string(s.Status), string(s.Lease)}]++
	}
	for k, v := range shards {
		gauge(ch, descShards, float64(v), k.status, k.lease)
	}

	gauge(ch, descReconcile, snap.ReconcileTook().Seconds())
	passes, computed := snap.Plans()
	counter(ch, descReconciles, float64(passes))
	counter(ch, descPlans, float64(computed), "computed")
	counter(ch, descPlans, float64(passes-computed), "skipped")
	st := c.n.GossipStats()
	counter(ch, descGossip, float64(st.Sent), "sent")
	counter(ch, descGossip, float64(st.Received), "received")
	counter(ch, descGossip, float64(st.Dropped), "dropped")
	for way, n := range st.Traffic.BytesIn {
		counter(ch, descGossipBytes, float64(n), "in", way)
	}
	for way, n := range st.Traffic.BytesOut {
		counter(ch, descGossipBytes, float64(n), "out", way)
	}
	for kind, n := range st.Traffic.RecordsIn {
		counter(ch, descGossipRecords, float64(n), kind)
	}
	counter(ch, descGossipDuplicates, float64(st.Traffic.Duplicates))
	for _, r := range gossip.DropReasons() {
		counter(ch, descGossipDrops, float64(st.Drops[r]), string(r))
	}
	gauge(ch, descGossipMembers, float64(st.Members))
	gauge(ch, descTokenMismatch, float64(st.TokenMismatches))
	if st.ClockPeers > 0 {
		gauge(ch, descClockOffset, st.ClockOffset.Seconds())
	}
	gauge(ch, descClusterVersion, float64(st.ActiveVersion))
	gauge(ch, descProtocolVersion, float64(st.Protocol.Min), "min")
	gauge(ch, descProtocolVersion, float64(st.Protocol.Max), "max")
	gauge(ch, descVersionsMixed, b2f(!st.VersionsMixedSince.IsZero()))

	if self, ok := snap.Member(snap.Self()); ok {
		gauge(ch, descIsolated, b2f(self.Isolated))
		c.collectSelf(ch, self)
	}
	if c.scrapeErrors != nil {
		counter(ch, descScrapeErrors, float64(c.scrapeErrors()))
	}
}

// collectSelf reports this node's GPUs and engines from its own record,
// which is what it gossips to everyone else.
func (c *nodeCollector) collectSelf(ch chan<- prometheus.Metric, self status.MemberInfo) {
	gpus := slices.Clone(self.GPUs)
	slices.SortFunc(gpus, func(a, b placement.GPU) int { return a.Index - b.Index })
	for _, g := range gpus {
		idx := strconv.Itoa(g.Index)
		gauge(ch, descGPUTotal, float64(g.MemoryTotal), idx, g.UUID, g.Name)
		gauge(ch, descGPUUsed, float64(g.MemoryUsed), idx, g.UUID)
		gauge(ch, descGPUForeign, float64(g.MemoryForeign), idx, g.UUID)
		gauge(ch, descGPUFaulted, b2f(g.Faulted), idx, g.UUID)
	}
	gauge(ch, descDriverFaults, float64(self.Probes.DriverFaultsRecent), "recent")
	gauge(ch, descDriverFaults, float64(self.Probes.DriverFaultsBoot), "boot")
	// A shard can appear twice during a rolling change (old and new spec
	// version); the labels would collide, so the newest-started wins.
	seen := map[string]bool{}
	held := slices.Clone(self.Shards)
	slices.SortStableFunc(held, func(a, b gossip.ShardRecord) int { return b.StartedAt.Compare(a.StartedAt) })
	for _, s := range held {
		if seen[s.ShardID] {
			continue
		}
		seen[s.ShardID] = true
		l := s.Load
		gauge(ch, descEngineRestarts, float64(s.Restarts), s.ShardID, s.Deployment)
		if l.ScrapedAt.IsZero() && l.Error == "" {
			continue // never scraped: no load to report
		}
		gauge(ch, descEngineScrapeFailing, b2f(l.Error != ""), s.ShardID, s.Deployment)
		gauge(ch, descEngineRunning, l.Running, s.ShardID, s.Deployment)
		gauge(ch, descEngineWaiting, l.Waiting, s.ShardID, s.Deployment)
		if l.Knows(gossip.ReadingKVCache) { // unknown is no sample, not 0
			gauge(ch, descEngineKV, l.KVCacheUsage, s.ShardID, s.Deployment)
		}
		if l.RatesValid {
			gauge(ch, descEngineTPS, l.PromptTPS, s.ShardID, s.Deployment, "prompt")
			gauge(ch, descEngineTPS, l.GenerationTPS, s.ShardID, s.Deployment, "generation")
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
