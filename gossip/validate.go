package gossip

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/llmgw/llmgw/placement"
)

// DropReason says why a record (or a whole message) was refused. Each
// refused record is counted under one reason (Stats.Drops) and the rest of
// its message is still taken.
type DropReason string

// The reasons a record is refused.
const (
	// DropMalformed: the whole message did not decode.
	DropMalformed DropReason = "malformed"
	// DropMalformedRecord: one record of a message (or of
	// deployments.json) did not decode, as when a later release changed
	// a field's type; the rest of the message is taken.
	DropMalformedRecord DropReason = "malformed_record"
	// DropInvalidDeployment: a deployment record fails the checks of
	// POST /v1/deployments, or its name is not its spec's.
	DropInvalidDeployment DropReason = "invalid_deployment"
	// DropInvalidNode: a node record or beat that no correct node sends.
	DropInvalidNode DropReason = "invalid_node"
	// DropStampAhead: a deployment's stamp is more than MaxClockOffset
	// ahead of this node's clock.
	DropStampAhead DropReason = "stamp_ahead"
	// DropEpochAhead: a boot epoch (record, beat or memberlist meta) is
	// more than MaxClockOffset ahead of this node's clock.
	DropEpochAhead DropReason = "epoch_ahead"
	// DropProtocolRefused: a node record or beat of a peer whose build
	// cannot speak this node's active protocol version (version.go).
	DropProtocolRefused DropReason = "protocol_refused"
)

// MaxClockOffset bounds how far ahead of this node's clock a stamp or a
// boot epoch may be and still be taken in, CockroachDB's max-offset idea.
// Witnessing a stamp moves this node's clock to it, so without a bound one
// node with a wrong clock (or one forged stamp) would drag every later
// write of the cluster ahead with it, and a stamp a year ahead would beat
// every honest write for a year.
//
// 30 s, not CockroachDB's 500 ms: llmgw orders operator writes, which are
// seconds apart, not transactions, and a loaded GPU host (or one whose NTP
// has not synced yet after boot) can be off by seconds; refusing its writes
// then would be the bigger harm. Anything synced by NTP or chrony is within
// milliseconds. A refusal is "not yet" rather than "never": the record
// arrives again with the next push/pull, and is taken once this node's
// clock is within the bound of it.
const MaxClockOffset = 30 * time.Second

// ahead reports whether t (Unix ns) lies more than MaxClockOffset after
// now.
func ahead(t int64, now time.Time) bool { return t > now.Add(MaxClockOffset).UnixNano() }

// DropReasons lists every reason, in a fixed order, so a reader can show
// each (at zero too: a vanished series is not a count that went to zero).
func DropReasons() []DropReason {
	return []DropReason{DropMalformed, DropMalformedRecord, DropInvalidDeployment, DropInvalidNode, DropStampAhead, DropEpochAhead, DropProtocolRefused}
}

// ErrInvalidRecord is wrapped by every error the record checks return.
var ErrInvalidRecord = errors.New("invalid gossip record")

// checkDeployment applies to a deployment record, from a peer or from
// deployments.json, what POST /v1/deployments applies to a spec: a node
// must not run, or make its peers run, what no API would have accepted.
// The stamp must come from a valid node and not lie beyond MaxClockOffset
// of now.
func checkDeployment(d DeploymentRecord, now time.Time) (DropReason, error) {
	bad := func(format string, args ...any) (DropReason, error) {
		return DropInvalidDeployment, fmt.Errorf("%w: deployment record %q: "+format, append([]any{ErrInvalidRecord, d.Name}, args...)...)
	}
	if err := placement.ValidateName(d.Name); err != nil {
		return bad("%w", err)
	}
	if err := ValidateNodeName(d.Stamp.Origin); err != nil {
		return bad("stamp.origin: %w", err)
	}
	if ahead(time.UnixMilli(d.Stamp.Wall).UnixNano(), now) {
		return DropStampAhead, fmt.Errorf("%w: deployment record %q: stamp.wall %s is %s ahead of this node's clock, beyond the %s bound (whose clock is wrong? see llmgw nodes)",
			ErrInvalidRecord, d.Name, time.UnixMilli(d.Stamp.Wall).UTC().Format(time.RFC3339), time.UnixMilli(d.Stamp.Wall).Sub(now).Round(time.Second), MaxClockOffset)
	}
	if d.Deleted {
		return "", nil
	}
	if d.Spec == nil {
		return bad("spec: missing on a record that is not a tombstone")
	}
	if d.Spec.Name != d.Name {
		return bad("spec.name: %q, want the record's name", d.Spec.Name)
	}
	if err := d.Spec.WithDefaults().Validate(); err != nil {
		return bad("spec.%w", err)
	}
	return "", nil
}

// checkEpoch refuses a boot epoch (Unix ns) beyond MaxClockOffset of now.
func checkEpoch(what string, epoch int64, now time.Time) (DropReason, error) {
	if ahead(epoch, now) {
		return DropEpochAhead, fmt.Errorf("%w: %s: epoch %s is %s ahead of this node's clock, beyond the %s bound",
			ErrInvalidRecord, what, time.Unix(0, epoch).UTC().Format(time.RFC3339), time.Unix(0, epoch).Sub(now).Round(time.Second), MaxClockOffset)
	}
	return "", nil
}

// checkNode checks a node record from a peer: a valid name, an epoch
// within the bound, addresses that parse, bounded counts (a record is held
// by every node and travels in every push/pull), and engine URLs at the
// holder's own address. A gateway sends requests where the URL says, so a
// record must not be able to point a shard at some other host.
func checkNode(r NodeRecord, now time.Time) (DropReason, error) {
	if err := ValidateNodeName(r.Name); err != nil {
		return DropInvalidNode, fmt.Errorf("%w: node record: %w", ErrInvalidRecord, err)
	}
	if reason, err := checkEpoch("node record "+r.Name+": version", r.Version.Epoch, now); err != nil {
		return reason, err
	}
	bad := func(field, format string, args ...any) (DropReason, error) {
		return DropInvalidNode, fmt.Errorf("%w: node record %q: %s: "+format, append([]any{ErrInvalidRecord, r.Name, field}, args...)...)
	}
	// The hosts the node advertises: its engines must be at one of them.
	// (API and gossip may differ, as in the netns scenarios.)
	hosts := map[string]bool{}
	for _, a := range []struct{ field, addr string }{{"api", r.API}, {"gossip", r.Gossip}, {"gateway", r.Gateway}} {
		if a.addr == "" {
			continue
		}
		h, p, err := net.SplitHostPort(a.addr)
		if port, perr := strconv.Atoi(p); err != nil || h == "" || perr != nil || port < 1 || port > 65535 {
			return bad(a.field, "%q, want host:port", a.addr)
		}
		if a.field != "gateway" {
			hosts[strings.ToLower(h)] = true
		}
	}
	if r.GatewayTLS && r.Gateway == "" {
		return bad("gateway_tls", "set without a gateway address")
	}
	if r.GatewayRates != nil && r.Gateway == "" {
		return bad("gateway_rates", "set without a gateway address")
	}
	if len(r.GatewayRates) > maxGatewayRates {
		return bad("gateway_rates", "%d deployments, at most %d", len(r.GatewayRates), maxGatewayRates)
	}
	for dep, rate := range r.GatewayRates {
		if err := placement.ValidateName(dep); err != nil {
			return bad("gateway_rates", "%q: %v", dep, err)
		}
		if math.IsNaN(rate) || rate < 0 || rate > maxGatewayRate {
			return bad("gateway_rates", "%s: %v requests/s, want 0 to %g", dep, rate, float64(maxGatewayRate))
		}
	}
	// A Unix minute in the year 9999 at the latest: anything later is a
	// broken clock or a forged record, and would sort last forever.
	const maxUnixMinute = 253402300799 / 60
	if r.GatewayQueued != nil && r.Gateway == "" {
		return bad("gateway_queued", "queues without a gateway")
	}
	if len(r.GatewayQueued) > maxGatewayRates {
		return bad("gateway_queued", "%d deployments, at most %d", len(r.GatewayQueued), maxGatewayRates)
	}
	for dep, n := range r.GatewayQueued {
		if err := placement.ValidateName(dep); err != nil {
			return bad("gateway_queued", "%q: %v", dep, err)
		}
		if n < 0 || n > maxGatewayQueued {
			return bad("gateway_queued", "%s: %d requests, want 0 to %d", dep, n, maxGatewayQueued)
		}
	}
	if len(r.Scale) > maxScaleTargets {
		return bad("scale", "%d targets, at most %d", len(r.Scale), maxScaleTargets)
	}
	for _, t := range r.Scale {
		if err := placement.ValidateName(t.Deployment); err != nil {
			return bad("scale", "%q: %v", t.Deployment, err)
		}
		if t.Replicas < 0 || t.Replicas > maxScaleReplicas {
			return bad("scale", "%s: %d replicas, want 0 to %d", t.Deployment, t.Replicas, maxScaleReplicas)
		}
		if t.ColdStartMs < 0 || t.ColdStartMs > maxStartMs || t.ColdStartPullMs < 0 || t.ColdStartPullMs > t.ColdStartMs ||
			t.ColdStartLoadMs < 0 || t.ColdStartLoadMs > t.ColdStartMs {
			return bad("scale", "%s: a cold start of %d ms (pull %d, load %d), want 0 to a week, its phases within it", t.Deployment, t.ColdStartMs, t.ColdStartPullMs, t.ColdStartLoadMs)
		}
		if t.LastRequest < 0 || t.LastRequest > maxUnixMinute {
			return bad("scale", "%s: last request minute %d, want 0 to %d", t.Deployment, t.LastRequest, int64(maxUnixMinute))
		}
		if len(t.Reason) > maxScaleReason {
			return bad("scale", "%s: a reason of %d bytes, at most %d", t.Deployment, len(t.Reason), maxScaleReason)
		}
	}
	if len(r.GPUs) > maxNodeGPUs {
		return bad("gpus", "%d GPUs, at most %d", len(r.GPUs), maxNodeGPUs)
	}
	seen := map[int]bool{}
	for _, g := range r.GPUs {
		if g.Index < 0 || seen[g.Index] {
			return bad("gpus", "index %d is negative or listed twice", g.Index)
		}
		seen[g.Index] = true
	}
	if len(r.Labels) > maxNodeLabels {
		return bad("labels", "%d labels, at most %d", len(r.Labels), maxNodeLabels)
	}
	for k, v := range r.Labels {
		if k == "" || len(k) > maxLabelLen || len(v) > maxLabelLen {
			return bad("labels", "%q=%q, want keys and values of at most %d characters", k, v, maxLabelLen)
		}
	}
	if reason, err := checkProbes(r.Probes, r.Telemetry, bad); err != nil {
		return reason, err
	}
	if field, msg := validCached(r.CachedModels); msg != "" {
		return bad(field, "%s", msg)
	}
	if len(r.Shards) > maxNodeShards {
		return bad("shards", "%d shards, at most %d", len(r.Shards), maxNodeShards)
	}
	for i, s := range r.Shards {
		field := fmt.Sprintf("shards[%d]", i)
		if s.ShardID == "" || len(s.ShardID) > maxShardID || strings.IndexFunc(s.ShardID, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0 {
			return bad(field+".shard_id", "%q, want 1-%d printable characters without spaces", s.ShardID, maxShardID)
		}
		if err := placement.ValidateName(s.Deployment); err != nil {
			return bad(field+".deployment", "%v", err)
		}
		if len(s.GPUs) > maxShardGPUs {
			return bad(field+".gpus", "%d GPUs, at most %d", len(s.GPUs), maxShardGPUs)
		}
		if s.Role != "" {
			// A role's replica is named for it (placement.RoleReplicaID),
			// so a gateway never sends a prefill leg to a replica that
			// only claims the role.
			dep, role, _, ok := placement.ParseReplicaID(s.ReplicaID)
			if !ok || dep != s.Deployment || role != s.Role {
				return bad(field+".role", "%q for replica %q of %q, want the role its replica ID names", s.Role, s.ReplicaID, s.Deployment)
			}
		}
		if s.KVPort < 0 || s.KVPort > 65535 || (s.KVPort != 0 && s.Role == "") {
			return bad(field+".kv_port", "%d, want a port, and only with a role", s.KVPort)
		}
		if l := s.Load; l.PrefixHitRate < 0 || l.PrefixHitRate > 1 || l.PrefixQueriesPS < 0 {
			return bad(field+".load", "prefix cache hit rate %g of %g/s, want a share 0-1 of a rate at least 0", l.PrefixHitRate, l.PrefixQueriesPS)
		}
		if len(s.Adapters) > placement.MaxAdapters || len(s.AdapterErrors) > placement.MaxAdapters {
			return bad(field+".adapters", "%d adapters and %d errors, at most %d each", len(s.Adapters), len(s.AdapterErrors), placement.MaxAdapters)
		}
		for _, a := range s.Adapters {
			if !placement.ValidAdapterName(a) {
				return bad(field+".adapters", "%q is no adapter name", a)
			}
		}
		for _, a := range s.AdapterErrors {
			if !placement.ValidAdapterName(a.Name) || len(a.Error) > maxShardNote || !printable(a.Error) {
				return bad(field+".adapter_errors", "%q: want an adapter name and at most %d printable bytes", a.Name, maxShardNote)
			}
		}
		if s.PullMs < 0 || s.PullMs > maxStartMs || s.LoadMs < 0 || s.LoadMs > maxStartMs {
			return bad(field+".pull_ms", "a pull of %d ms and a load of %d ms, want each 0 to a week", s.PullMs, s.LoadMs)
		}
		if len(s.Note) > maxShardNote || !printable(s.Note) {
			return bad(field+".note", "want at most %d printable bytes", maxShardNote)
		}
		if s.URL != "" {
			if err := checkEngineURL(s.URL, hosts); err != nil {
				return bad(field+".url", "%v", err)
			}
		}
		if s.Gang != nil {
			if f, err := checkGang(s, hosts); err != nil {
				return bad(field+".gang."+f, "%v", err)
			}
		}
	}
	return "", nil
}

// checkGang checks one shard's gang part: a rank that is the shard's own
// index, a size within placement's bound, and a rendezvous only from rank
// 0, at its holder's own host (other members dial it, so a record must not
// point them at some other host), naming valid nodes.
func checkGang(s ShardRecord, hosts map[string]bool) (string, error) {
	g := s.Gang
	if g.Size < 2 || g.Size > maxGangSize {
		return "size", fmt.Errorf("%d, want 2 to %d", g.Size, maxGangSize)
	}
	if j, ok := placement.ShardIndex(s.ShardID, s.ReplicaID); !ok || g.Rank != j || g.Rank >= g.Size {
		return "rank", fmt.Errorf("%d, want the shard's index in its replica, below the size %d", g.Rank, g.Size)
	}
	if g.Generation < 0 {
		return "generation", fmt.Errorf("%d, want 0 or more", g.Generation)
	}
	if len(g.Note) > maxGangNote || strings.IndexFunc(g.Note, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return "note", fmt.Errorf("want at most %d printable characters", maxGangNote)
	}
	if g.Rank > 0 {
		if g.Addr != "" || len(g.Members) > 0 {
			return "addr", fmt.Errorf("rank %d publishes a rendezvous; only rank 0 does", g.Rank)
		}
		return "", nil
	}
	if g.Addr != "" {
		h, p, err := net.SplitHostPort(g.Addr)
		port, perr := strconv.Atoi(p)
		if err != nil || perr != nil || port < 1 || port > 65535 {
			return "addr", fmt.Errorf("%q, want host:port", g.Addr)
		}
		if ip := net.ParseIP(h); (ip != nil && ip.IsUnspecified()) || !hosts[strings.ToLower(h)] {
			return "addr", fmt.Errorf("%q is not at the node's advertised address", g.Addr)
		}
	}
	if len(g.Members) != 0 && len(g.Members) != g.Size {
		return "members", fmt.Errorf("%d nodes, want one per rank (%d)", len(g.Members), g.Size)
	}
	for _, m := range g.Members {
		if m == "" {
			continue
		}
		if err := ValidateNodeName(m); err != nil {
			return "members", err
		}
	}
	return "", nil
}

// checkProbes checks what the node's probes say: every count and reading
// within what hardware can show, and text that is printable (a fault line
// is drawn on the page and in terminals).
func checkProbes(p ProbeSummary, t Telemetry, bad func(field, format string, args ...any) (DropReason, error)) (DropReason, error) {
	if p.DriverFaultsRecent < 0 || p.DriverFaultsBoot < 0 || p.XidRecent < 0 {
		return bad("probes", "negative driver fault count")
	}
	if len(p.LastDriverFault) > MaxFaultLine || !printable(p.LastDriverFault) {
		return bad("probes.last_driver_fault", "want at most %d printable bytes", MaxFaultLine)
	}
	if len(p.GPUDriver) > maxLabelLen || !printable(p.GPUDriver) {
		return bad("probes.gpu_driver", "want at most %d printable bytes", maxLabelLen)
	}
	if len(t.GPUs) > maxNodeGPUs {
		return bad("telemetry.gpus", "%d GPUs, at most %d", len(t.GPUs), maxNodeGPUs)
	}
	seen := map[int]bool{}
	for _, g := range t.GPUs {
		if g.Index < 0 || seen[g.Index] {
			return bad("telemetry.gpus", "index %d is negative or listed twice", g.Index)
		}
		seen[g.Index] = true
		if g.UtilPct < 0 || g.UtilPct > 100 || g.TempC < -100 || g.TempC > 300 || g.PowerW < 0 || g.PowerW > maxGPUWatts {
			return bad("telemetry.gpus", "GPU %d: utilisation %d%%, %d °C, %d W; want 0-100 %%, -100-300 °C, 0-%d W", g.Index, g.UtilPct, g.TempC, g.PowerW, maxGPUWatts)
		}
	}
	if len(t.Links) > maxNodeLinks {
		return bad("telemetry.links", "%d links, at most %d", len(t.Links), maxNodeLinks)
	}
	for _, l := range t.Links {
		if l.Device == "" || len(l.Device) > 64 || strings.IndexFunc(l.Device, func(r rune) bool {
			return !(r == '_' || r == '-' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
		}) >= 0 {
			return bad("telemetry.links", "device %q, want 1-64 letters, digits, '_', '-' or '.'", l.Device)
		}
		if l.Port < 0 || l.Port > 1024 || !rate(l.TxMBps) || !rate(l.RxMBps) {
			return bad("telemetry.links", "%s port %d: %v / %v MB/s, want a port of 0-1024 and rates of 0-%g MB/s", l.Device, l.Port, l.TxMBps, l.RxMBps, maxLinkMBps)
		}
	}
	return "", nil
}

func printable(s string) bool {
	return utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0
}

// rate is a finite rate within what any link carries (NaN fails both
// comparisons).
func rate(v float64) bool { return v >= 0 && v <= maxLinkMBps }

// checkEngineURL wants http(s)://host:port at one of the holder's hosts.
func checkEngineURL(raw string, hosts map[string]bool) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.User != nil || u.Hostname() == "" {
		return fmt.Errorf("%q, want http://host:port without credentials", raw)
	}
	if port, err := strconv.Atoi(u.Port()); err != nil || port < 1 || port > 65535 {
		return fmt.Errorf("%q, want a port from 1 to 65535", raw)
	}
	h := strings.ToLower(u.Hostname())
	if ip := net.ParseIP(h); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("%q is a wildcard address, which reaches no engine from another host (give the node --advertise)", raw)
	}
	if !hosts[h] {
		return fmt.Errorf("%q is not at the node's advertised address", raw)
	}
	return nil
}

// checkBeat checks a renewal from a peer.
func checkBeat(b Beat, now time.Time) (DropReason, error) {
	if err := ValidateNodeName(b.Name); err != nil {
		return DropInvalidNode, fmt.Errorf("%w: beat: %w", ErrInvalidRecord, err)
	}
	return checkEpoch("beat "+b.Name+": version", b.Version.Epoch, now)
}

// Bounds of a node record: far above any real node (8 GPUs, a few dozen
// shards), far below what would make every node's copy of the state, and
// every push/pull, large.
const (
	maxNodeGPUs   = 256
	maxNodeShards = 1024
	// maxShardGPUs is placement's bound on tensor_parallel.
	maxShardGPUs  = 64
	maxNodeLabels = 64
	maxLabelLen   = 256
	maxShardID    = 256
	maxNodeLinks  = 64
	// maxGPUWatts and maxLinkMBps are far above any board (about 1 kW)
	// and any port (800 Gb/s is 100,000 MB/s).
	maxGPUWatts = 100_000
	maxLinkMBps = 10_000_000
	// maxGangSize is placement's bound on pipeline_parallel.
	maxGangSize = 64
	maxGangNote = 300
	// maxGatewayQueued bounds one deployment's queue at one gateway.
	maxGatewayQueued = 1 << 20
	// maxStartMs bounds a start's phases and a cold start, in ms: a week.
	maxStartMs = 7 * 24 * 3600 * 1000
	// maxShardNote bounds a shard's note (the runner clips it to 300).
	maxShardNote = 320
)

// maxNodeName bounds a node name; memberlist carries it in every packet.
const maxNodeName = 128

// ValidateNodeName checks a node name: 1-128 characters, no whitespace or
// control characters, and no '/', which separates name from address where
// memberlist is told whom it dials ("name/host:port").
func ValidateNodeName(name string) error {
	bad := func(want string) error {
		return &placement.FieldError{Field: "name", Value: name, Want: want}
	}
	if name == "" || len(name) > maxNodeName {
		return bad(fmt.Sprintf("a node name of 1-%d characters", maxNodeName))
	}
	if strings.IndexFunc(name, func(r rune) bool { return r == '/' || unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0 {
		return bad("a node name without spaces, control characters or '/'")
	}
	return nil
}

// Bounds on a record's gateway rates: a deployment each, at most a
// million requests a second.
const (
	maxGatewayRates = 1024
	maxGatewayRate  = 1e6
)

// Bounds on a record's scale targets: one per deployment, as many
// replicas as a spec may ask for, a line of reason.
const (
	maxScaleTargets  = 1024
	maxScaleReplicas = 1000
	maxScaleReason   = 256
)

// Bounds on a record's cached models: what one weights scan may report.
const (
	maxCachedModels = 256
	maxCachedName   = 512
)

// validCached checks a record's cached models as a spec's model is checked:
// a name of at most 512 printable characters, each once. It returns the bad
// field and what is wrong with it.
func validCached(models []CachedModel) (field, msg string) {
	if len(models) > maxCachedModels {
		return "cached_models", fmt.Sprintf("%d models, at most %d", len(models), maxCachedModels)
	}
	seen := make(map[string]bool, len(models))
	for i, m := range models {
		field := fmt.Sprintf("cached_models[%d]", i)
		if m.Model == "" || len(m.Model) > maxCachedName || strings.IndexFunc(m.Model, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			return field, fmt.Sprintf("%q, want 1-%d printable characters", m.Model, maxCachedName)
		}
		if seen[m.Model] {
			return field, fmt.Sprintf("%q listed twice", m.Model)
		}
		seen[m.Model] = true
	}
	return "", ""
}
