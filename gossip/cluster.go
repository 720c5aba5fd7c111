package gossip

import (
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/placement"
)

// Config configures one node's gossip.
type Config struct {
	Name string
	// BindAddr and BindPort are where memberlist listens (UDP and TCP).
	BindAddr string
	BindPort int
	// AdvertiseAddr and AdvertisePort are what peers dial. Required when
	// BindAddr is a wildcard on a host with several addresses.
	AdvertiseAddr string
	AdvertisePort int
	// Key, when set (16, 24 or 32 bytes), encrypts all gossip (AES-GCM).
	Key []byte
	// Label tags every packet; nodes with another label are ignored.
	Label   string
	Profile Profile
	Logger  *slog.Logger
	Clock   clock.Clock
	// DeploymentsFile, when set, is where deployments persist so a
	// whole-cluster restart loses nothing (the data dir's deployments.json,
	// named by supervisor/datadir).
	DeploymentsFile string
	// APIAddr is this node's HTTP address, carried in node meta.
	APIAddr string
	// TombstoneTTL is how long deletions are remembered (default 30 days).
	TombstoneTTL time.Duration
	// Drop, when set, is consulted for every packet and stream to or from
	// another node, and drops it when it returns true. TEST ONLY: it
	// simulates network partitions where network namespaces are not
	// available.
	Drop func(peer string) bool
	// TokenFingerprint identifies the cluster token without revealing it
	// (supervisor derives it: an HMAC of a fixed label keyed by the
	// token). It rides in node meta; a peer announcing another one has
	// another token, and each side logs an error naming the other. Empty:
	// nothing is announced or compared.
	TokenFingerprint string

	// Protocol is the range of protocol versions this node speaks and
	// announces in its meta (zero: this build's, protocol.Build()). Tests
	// run nodes of other ranges with it.
	Protocol protocol.Range
	// ActiveVersion is the cluster version this node starts at: the one
	// it ran at before it restarted (node.json keeps it). 0 is the
	// lowest this node speaks; above its Max, New fails.
	ActiveVersion int
	// VersionSettle (T) is how long no member speaking less may have been
	// seen before a version becomes active (0: DefaultVersionSettle).
	VersionSettle time.Duration
	// VersionDeadAfter (D) is how long a dead member still counts for the
	// cluster version (0: DefaultVersionDeadAfter).
	VersionDeadAfter time.Duration
	// OnActiveVersion, when set, is called with each new active version
	// once it rose (the node persists it), in order. It runs on the
	// version loop, which waits for it: it may read the Cluster, and
	// should not block for long.
	OnActiveVersion func(int)
	// BeatQuiet: a beat that renews a record this node accepted a newer
	// version of less than BeatQuiet ago does not signal Changes (the
	// record's SeenAt still moves). The node sets it below its lease TTL
	// and above its renew interval: such a renewal changes no lease it
	// judges, and its loop judges lapses on a tick of its own. 0: every
	// accepted beat signals. A live member whose record was last renewed
	// more than BeatQuiet ago is asked for it (askStale): one of its beats
	// was lost. 0: nobody is asked.
	BeatQuiet time.Duration
}

// MemberState is memberlist's verdict on a node, as this node sees it.
type MemberState string

const (
	StateAlive   MemberState = "alive"
	StateSuspect MemberState = "suspect"
	StateDead    MemberState = "dead"
	StateLeft    MemberState = "left"
	// StateUnknown: a record arrived for a node memberlist has not met.
	StateUnknown MemberState = "unknown"
	// StateRefused: the node's build cannot speak this node's active
	// protocol version; it is kept out of membership and its records are
	// dropped (Member.Protocol says what it speaks).
	StateRefused MemberState = "refused"
)

// Member is one node as this node knows it.
type Member struct {
	Name    string      `json:"name"`
	State   MemberState `json:"state"`
	Address string      `json:"address"`
	// Since is when this node last saw the state change.
	Since time.Time `json:"since"`
	// Record is the node's last record, nil if none arrived yet.
	Record *NodeRecord `json:"record,omitempty"`
	// SeenAt is when this node last accepted a newer version of Record.
	SeenAt time.Time `json:"seen_at,omitzero"`
	// Epoch is the boot epoch the node announced in memberlist (0 if
	// unknown). A Record of an older epoch is what the node said before it
	// restarted: its claims are void.
	Epoch int64 `json:"epoch,omitempty"`
	// ClockOffset is the node's clock minus the cluster's, as this node
	// estimates it from probes (nil until a peer was probed).
	ClockOffset *time.Duration `json:"clock_offset_ns,omitempty"`
	// TokenMismatch: the node announces another cluster token's
	// fingerprint. API calls between the two fail, and MCP forwarding.
	TokenMismatch bool `json:"token_mismatch,omitempty"`
	// Protocol is the range of protocol versions the node announces in its
	// meta ([1, 1] for an agent from before cluster versions; zero when
	// memberlist has not met it).
	Protocol protocol.Range `json:"protocol,omitzero"`
}

// Stats count gossip traffic.
type Stats struct {
	Sent     uint64 `json:"sent"`
	Received uint64 `json:"received"`
	Dropped  uint64 `json:"dropped"`
	Members  int    `json:"members"`
	// Drops counts refused records (and undecodable messages) by reason;
	// every reason of DropReasons is present.
	Drops map[DropReason]uint64 `json:"drops"`
	// ClockOffset is this node's clock minus the cluster's, estimated from
	// ClockPeers peers (0: no estimate).
	ClockOffset time.Duration `json:"clock_offset_ns"`
	ClockPeers  int           `json:"clock_peers"`
	// TokenMismatches counts members announcing another token.
	TokenMismatches int `json:"token_mismatches"`
	// ActiveVersion is the cluster version this node runs at, Protocol
	// the range it speaks, and VersionsMixedSince since when live members
	// announce different versions (zero: they do not).
	ActiveVersion      int            `json:"active_version"`
	Protocol           protocol.Range `json:"protocol"`
	VersionsMixedSince time.Time      `json:"versions_mixed_since,omitzero"`
	// Traffic is what this node's gossip carried, by way and kind.
	Traffic Traffic `json:"traffic"`
}

// Traffic counts gossip bytes by direction and way (gossip: memberlist's
// piggybacked broadcasts; direct: a record sent to one member over TCP,
// which arrives as gossip does and is counted there; push_pull: the
// periodic whole-state exchange), and the records received by kind, so an
// operator can see which part grows with the cluster. Memberlist's own
// probes are not counted.
type Traffic struct {
	BytesIn  map[string]uint64 `json:"bytes_in"`
	BytesOut map[string]uint64 `json:"bytes_out"`
	// RecordsIn counts node records, beats (renewals) and deployment
	// records received, before the merge decides whether they are news.
	RecordsIn map[string]uint64 `json:"records_in"`
	// Duplicates counts messages dropped unread: byte for byte copies of
	// one taken before (dedup.go).
	Duplicates uint64 `json:"duplicates"`
}

// The ways and kinds Traffic names.
const (
	WayGossip   = "gossip"
	WayDirect   = "direct"
	WayPushPull = "push_pull"

	KindNode       = "node"
	KindBeat       = "beat"
	KindDeployment = "deployment"
)

type traffic struct {
	inGossip, inPushPull, outGossip, outDirect, outPushPull atomic.Uint64
	nodes, beats, deployments                               atomic.Uint64
	duplicates                                              atomic.Uint64
}

func (t *traffic) snapshot() Traffic {
	return Traffic{
		BytesIn:    map[string]uint64{WayGossip: t.inGossip.Load(), WayPushPull: t.inPushPull.Load()},
		BytesOut:   map[string]uint64{WayGossip: t.outGossip.Load(), WayDirect: t.outDirect.Load(), WayPushPull: t.outPushPull.Load()},
		RecordsIn:  map[string]uint64{KindNode: t.nodes.Load(), KindBeat: t.beats.Load(), KindDeployment: t.deployments.Load()},
		Duplicates: t.duplicates.Load(),
	}
}

// Cluster is one node's membership in the gossip cluster.
type Cluster struct {
	cfg   Config
	log   *slog.Logger
	ml    *memberlist.Memberlist
	queue *memberlist.TransmitLimitedQueue
	store *Store
	hlc   *HLC

	mu      sync.Mutex
	members map[string]*memberInfo
	local   NodeRecord
	content Version // version of local's current content
	// epoch is this node's boot epoch, announced in node meta.
	epoch int64
	// wanted remembers the content version last asked for per node, and
	// when: a lost request is asked again after wantRetry.
	wanted map[string]wantedAt
	// sendMu orders this node's record versions with their broadcasts.
	sendMu sync.Mutex
	// answer is this node's record encoded at version, as sendLocalTo
	// last sent it, under answerMu.
	answerMu sync.Mutex
	answer   struct {
		version Version
		b       []byte
	}
	// spawnMu and stopping make goroutine starts safe against Shutdown.
	spawnMu  sync.Mutex
	stopping bool
	// saveMu makes each write of deployments.json hold a snapshot taken
	// after the previous write: two saves racing could otherwise land the
	// older snapshot last and lose an acknowledged place.
	saveMu sync.Mutex

	changes chan struct{}
	persist chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup

	sent, received, dropped atomic.Uint64
	// traffic counts bytes and records by way and kind (Stats.Traffic).
	traffic traffic
	// seen drops copies of broadcasts already taken (dedup.go).
	seen *seenMessages
	// drops counts refused records by reason; the map is fixed at New.
	drops map[DropReason]*atomic.Uint64
	// refusedAt is when a refusal was last logged, per reason and record:
	// a bad record a peer holds comes back with every push/pull.
	refusedAt map[string]time.Time
	// clocks are the samples of each peer's clock (clock.go);
	// clockLevel is how far off this node's own clock was last found, and
	// clockWarnedAt when it last said so. Under mu.
	clocks        map[string]*clockSamples
	clockLevel    int
	clockWarnedAt time.Time
	// ready is set once ml and queue exist. memberlist.Create starts its
	// listeners before it returns, and a peer that still knows this
	// address (an agent restarted in place) may gossip to it at once;
	// until then such messages are ignored (push/pull brings them again).
	ready atomic.Bool
	// bigThreshold: messages above it go by SendReliable, through big.
	bigThreshold int
	big          bigQueue
	// lastHeard is when a peer was last heard, Unix ns (contact.go).
	lastHeard atomic.Int64
	// ver is the cluster version (version.go).
	ver versions
}

type memberInfo struct {
	state MemberState
	addr  string
	since time.Time
	epoch int64
	// token is the token fingerprint the node announces ("" if none).
	token string
	// proto is the protocol range its meta announces, active the version
	// it says it runs at (0: an agent from before cluster versions).
	proto  protocol.Range
	active int
}

// New starts memberlist listening and returns the node, not yet joined to
// anyone. initial is this node's first record; its Name and Version.Epoch
// must be set.
func New(cfg Config, initial NodeRecord) (*Cluster, error) {
	if cfg.Name == "" {
		return nil, errors.New("gossip: node name is empty")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if cfg.TombstoneTTL == 0 {
		cfg.TombstoneTTL = 30 * 24 * time.Hour
	}
	if cfg.Profile.base == nil {
		cfg.Profile, _ = ProfileByName("lan")
	}
	if err := versionConfig(&cfg); err != nil {
		return nil, err
	}
	if len(cfg.Key) > 0 {
		if err := memberlist.ValidateKey(cfg.Key); err != nil {
			return nil, fmt.Errorf("gossip key: %w (want 16, 24 or 32 bytes)", err)
		}
	}
	c := &Cluster{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "gossip"),
		hlc:     NewHLC(cfg.Name, cfg.Clock),
		seen:    newSeenMessages(),
		members: map[string]*memberInfo{},
		drops:   map[DropReason]*atomic.Uint64{},
		changes: make(chan struct{}, 1),
		persist: make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	for _, r := range DropReasons() {
		c.drops[r] = new(atomic.Uint64)
	}
	c.store = NewStore(cfg.Clock, cfg.TombstoneTTL, c.ActiveVersion)
	c.ver.init(cfg, cfg.Clock.Now())
	if err := c.loadDeployments(); err != nil {
		return nil, err
	}
	initial.Name = cfg.Name
	if initial.Version.Seq == 0 {
		initial.Version.Seq = 1
	}
	c.local = initial
	c.epoch = initial.Version.Epoch
	c.content = initial.Version
	c.local.Content = initial.Version
	c.store.MergeNode(c.local)

	mc := cfg.Profile.Config()
	mc.Name = cfg.Name
	mc.BindAddr = cfg.BindAddr
	mc.BindPort = cfg.BindPort
	mc.AdvertiseAddr = cfg.AdvertiseAddr
	mc.AdvertisePort = cfg.AdvertisePort
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = cfg.BindPort
	}
	mc.Label = cfg.Label
	// Our messages are deflated already (codec.go); memberlist's own LZW
	// pass over every packet gained nothing on them and was a fifth of an
	// idle agent's garbage (40 nodes, measured with --debug-addr). Every
	// memberlist decodes packets with or without it, so mixed clusters
	// are unaffected.
	mc.EnableCompression = false
	if len(cfg.Key) > 0 {
		mc.SecretKey = cfg.Key
	}
	mc.Delegate = &delegate{c: c}
	mc.Events = &eventDelegate{c: c}
	mc.Ping = &pingDelegate{c: c}
	mc.Alive = &aliveDelegate{c: c}
	mc.Logger = log.New(memberlistLog{log: cfg.Logger}, "", 0)
	t, err := newTransport(mc.BindAddr, mc.BindPort, mc.Logger)
	if err != nil {
		return nil, fmt.Errorf("gossip: listen on %s: %w", net.JoinHostPort(cfg.BindAddr, strconv.Itoa(cfg.BindPort)), err)
	}
	if mc.BindPort == 0 {
		mc.BindPort = t.Port()
	}
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = mc.BindPort
	}
	mc.Transport = t
	if cfg.Drop != nil {
		mc.Transport = &dropTransport{transport: t, drop: cfg.Drop, nameOf: c.nameAt}
	}
	// Half a packet, as Alertmanager does: leaves room for memberlist's
	// framing and for piggybacking several deltas in one packet. (A whole
	// packet, tried in scaletest, sent most record changes as gossip: at
	// 100 nodes settling, more of node 0's leases lapsed than with half,
	// likely beats waiting behind records in each gossip round.)
	c.bigThreshold = mc.UDPBufferSize / 2

	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = t.Shutdown()
		return nil, fmt.Errorf("gossip: listen on %s: %w", net.JoinHostPort(cfg.BindAddr, strconv.Itoa(cfg.BindPort)), err)
	}
	c.ml = ml
	c.queue = &memberlist.TransmitLimitedQueue{NumNodes: ml.NumMembers, RetransmitMult: mc.RetransmitMult}
	c.ready.Store(true)
	c.spawn(c.persistLoop)
	c.spawn(c.versionLoop)
	if cfg.BeatQuiet > 0 {
		c.spawn(c.staleLoop)
	}
	return c, nil
}

// Address is the gossip address peers dial.
func (c *Cluster) Address() string { return c.ml.LocalNode().Address() }

// Join contacts the given addresses; it succeeds if any answered.
func (c *Cluster) Join(addrs []string) (int, error) {
	n, err := c.ml.Join(addrs)
	if err != nil && n == 0 {
		return 0, joinError(addrs, err)
	}
	return n, nil
}

// NumMembers counts alive and suspect members, this node included.
func (c *Cluster) NumMembers() int { return c.ml.NumMembers() }

// StateBytes is the size of the whole state as push/pull sends it.
func (c *Cluster) StateBytes() int {
	b, err := encode(c.store.full())
	if err != nil {
		return 0
	}
	return len(b)
}

// Changes is signalled (without blocking, coalesced) whenever the replicated
// state or membership changes, and for a renewal that ends a silence (see
// Config.BeatQuiet).
func (c *Cluster) Changes() <-chan struct{} { return c.changes }

func (c *Cluster) notify() {
	select {
	case c.changes <- struct{}{}:
	default:
	}
}

// nameAt names the node whose record advertises gossip address addr.
func (c *Cluster) nameAt(addr string) string {
	for _, ns := range c.store.Nodes() {
		if ns.Record.Gossip == addr {
			return ns.Record.Name
		}
	}
	return ""
}

// Local returns this node's current record.
func (c *Cluster) Local() NodeRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.local
}

// StampAfter is a stamp of this node later than s and than every stamp
// it issued or saw: a decider that takes over writes its target after
// its predecessor's, whatever their clocks say.
func (c *Cluster) StampAfter(s Stamp) Stamp {
	c.hlc.Witness(s)
	return c.hlc.Now()
}

// UpdateLocal changes this node's record through fn, bumps its version and
// sends it to the cluster.
func (c *Cluster) UpdateLocal(fn func(r *NodeRecord)) NodeRecord {
	// sendMu keeps bump, store and queue in one order: two concurrent
	// updates must not queue v5 after v6 (named broadcasts replace).
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.mu.Lock()
	fn(&c.local)
	c.local.Name = c.cfg.Name
	c.local.Version.Seq++
	c.content = c.local.Version
	c.local.Content = c.content
	r := c.local
	c.mu.Unlock()
	// Peers check this record as this node checks theirs. Sending one
	// they refuse would leave this node out of their placement unnoticed.
	if _, err := checkNode(r, c.cfg.Clock.Now()); err != nil && c.logNow("self/"+err.Error()) {
		c.log.Error("peers will refuse this node's record", "err", err)
	}
	// Encoded once: the store and the broadcast hold these bytes.
	m := localMessage(r)
	c.store.mergeNode(r, m.nodeRaw[0])
	c.send("node/"+r.Name, m)
	c.notify()
	return r
}

// localMessage is a message carrying this node's record r alone, in the
// bytes it is stored and sent in.
func localMessage(r NodeRecord) message {
	return message{Nodes: []NodeRecord{r}, nodeRaw: []json.RawMessage{rawOf(r)}}
}

// Renew bumps this node's version without changing its content. Every
// receiver that holds the content restarts the TTL of this node's leases.
//
// The beat goes from here to every member, one packet each (beatToAll),
// rather than as gossip: every node must hear every node's beat within
// the TTL, and gossip delivers each message RetransmitMult·⌈log10(N+1)⌉
// times to every node (8 copies at 40 nodes, 12 at 500), so that beats were
// most of an idle node's bytes and grew as N·log N. A lost packet is asked
// for again (askStale).
func (c *Cluster) Renew() {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.mu.Lock()
	c.local.Version.Seq++
	b := Beat{Name: c.cfg.Name, Version: c.local.Version, Content: c.content}
	c.mu.Unlock()
	c.store.MergeBeat(b)
	c.beatToAll(b)
}

// PutDeployment records spec as the newest desired state for its name,
// persists it, and sends it to the cluster. The spec must be valid.
func (c *Cluster) PutDeployment(spec placement.Deployment) (DeploymentRecord, error) {
	return c.putDeployment(DeploymentRecord{Name: spec.Name, Spec: &spec})
}

// DeleteDeployment replaces a deployment with a tombstone. It reports
// false, and changes nothing, when no live deployment has that name.
func (c *Cluster) DeleteDeployment(name string) (DeploymentRecord, bool, error) {
	old, ok := c.store.Deployment(name)
	if !ok || old.Deleted {
		return DeploymentRecord{}, false, nil
	}
	r, err := c.putDeployment(DeploymentRecord{Name: name, Deleted: true})
	return r, true, err
}

// putDeployment stamps r, saves it and takes it into the store.
func (c *Cluster) putDeployment(r DeploymentRecord) (DeploymentRecord, error) {
	if err := c.checkClockForWrite(); err != nil {
		return r, fmt.Errorf("deployment %s: %w", r.Name, err)
	}
	// Persist before answering: an acknowledged place must survive this
	// node crashing the next instant. And persist before taking it into
	// the store: a place that could not be saved is refused, so it must
	// not spread either.
	c.saveMu.Lock()
	deps := c.store.depEntries()
	// Stamp after the snapshot, and past the record r replaces: the stamp
	// then beats what the file will hold beside it. (Stamped before, a
	// peer's later write could land in between, and the file would keep
	// the loser.)
	if old, ok := findDeployment(deps, r.Name); ok {
		c.hlc.Witness(old.rec.Stamp)
	}
	r.Stamp = c.hlc.Now()
	// Encoded once: the file, the store and the broadcast hold these bytes.
	e := depEntry{rec: r, raw: rawOf(r)}
	err := c.writeDeployments(withDeployment(deps, e))
	if err == nil && !c.store.mergeDeployment(e) {
		// A later write of this name arrived while r was being saved: it
		// stands, r does not, and the file must not keep r.
		cur, _ := c.store.Deployment(r.Name)
		err = fmt.Errorf("deployment %s: a later write (stamp %v) arrived while this one was saved; it stands, this one was not applied", r.Name, cur.Stamp)
		if werr := c.writeDeployments(c.store.depEntries()); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	c.saveMu.Unlock()
	if err != nil {
		return r, err
	}
	c.send("dep/"+r.Name, e.message())
	c.notify()
	return r, nil
}

// Deployment returns one deployment record, if it is live.
func (c *Cluster) Deployment(name string) (DeploymentRecord, bool) {
	d, ok := c.store.Deployment(name)
	return d, ok && !d.Deleted
}

// Deployments returns every deployment record, tombstones included.
func (c *Cluster) Deployments() []DeploymentRecord { return c.store.Deployments() }

// Members returns every node this node knows of, sorted by name.
func (c *Cluster) Members() []Member {
	live := map[string]*memberlist.Node{}
	for _, n := range c.ml.Members() {
		live[n.Name] = n
	}
	active := c.ActiveVersion()
	c.mu.Lock()
	defer c.mu.Unlock()
	self, clocks, sampled := c.clockView(c.cfg.Clock.Now())
	clockOf := func(name string) *time.Duration {
		if d, ok := clocks[name]; ok {
			return &d
		}
		if name == c.cfg.Name && sampled > 0 {
			return &self
		}
		return nil
	}
	var out []Member
	seen := map[string]bool{}
	for _, ns := range c.store.Nodes() {
		rec := ns.Record
		m := Member{Name: rec.Name, State: StateUnknown, Address: rec.Gossip, Record: &rec, SeenAt: ns.SeenAt, ClockOffset: clockOf(rec.Name)}
		if info, ok := c.members[rec.Name]; ok {
			m.State, m.Address, m.Since, m.Epoch = info.state, info.addr, info.since, info.epoch
			m.TokenMismatch = c.otherToken(info.token)
			m.Protocol = info.proto
		}
		if n, ok := live[rec.Name]; ok && n.State == memberlist.StateSuspect {
			m.State = StateSuspect
		}
		if m.State == StateDead && rec.Leaving {
			m.State = StateLeft
		}
		if rec.Name == c.cfg.Name {
			m.State, m.Protocol = StateAlive, c.ver.own
		}
		c.markRefused(&m, active)
		out = append(out, m)
		seen[rec.Name] = true
	}
	for name, info := range c.members {
		if !seen[name] {
			m := Member{Name: name, State: info.state, Address: info.addr, Since: info.since, ClockOffset: clockOf(name),
				TokenMismatch: c.otherToken(info.token), Protocol: info.proto}
			c.markRefused(&m, active)
			out = append(out, m)
			seen[name] = true
		}
	}
	for name := range c.ver.refused {
		if !seen[name] {
			m := Member{Name: name}
			c.markRefused(&m, active)
			out = append(out, m)
		}
	}
	sortMembers(out)
	return out
}

func sortMembers(ms []Member) {
	sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
}

// Stats returns traffic counters.
func (c *Cluster) Stats() Stats {
	drops := make(map[DropReason]uint64, len(c.drops))
	for r, n := range c.drops {
		drops[r] = n.Load()
	}
	off, peers := c.ClockOffset()
	mismatches := 0
	c.mu.Lock()
	for _, info := range c.members {
		if c.otherToken(info.token) {
			mismatches++
		}
	}
	mixedSince := c.ver.mixedSince
	c.mu.Unlock()
	return Stats{Sent: c.sent.Load(), Received: c.received.Load(), Dropped: c.dropped.Load(), Members: c.ml.NumMembers(), Drops: drops,
		ClockOffset: off, ClockPeers: peers, TokenMismatches: mismatches,
		ActiveVersion: c.ActiveVersion(), Protocol: c.ver.own, VersionsMixedSince: mixedSince, Traffic: c.traffic.snapshot()}
}

// otherToken reports whether a peer's announced token fingerprint shows
// another cluster token than this node's. Nothing announced (an older
// agent, or no token) is no evidence either way.
func (c *Cluster) otherToken(fingerprint string) bool {
	return c.cfg.TokenFingerprint != "" && fingerprint != "" && fingerprint != c.cfg.TokenFingerprint
}

// Leave tells the cluster this node is leaving, so peers mark it left
// rather than dead, then stops gossip.
func (c *Cluster) Leave(timeout time.Duration) error {
	c.sendMu.Lock()
	c.mu.Lock()
	c.local.Leaving = true
	c.local.Version.Seq++
	c.content = c.local.Version
	c.local.Content = c.content
	r := c.local
	c.mu.Unlock()
	m := localMessage(r)
	c.store.mergeNode(r, m.nodeRaw[0])
	c.sendMu.Unlock()
	if b, err := encode(m); err == nil {
		// Tell everyone over TCP, and wait: a broadcast queued now might
		// never leave before shutdown.
		c.toEveryone(b)
	}
	err := c.ml.Leave(timeout)
	if serr := c.Shutdown(); err == nil {
		err = serr
	}
	return err
}

// Shutdown stops gossip without telling anyone: peers will find this node
// dead. It is what a crash looks like, and what tests use to simulate one.
func (c *Cluster) Shutdown() error {
	select {
	case <-c.done:
		return nil
	default:
	}
	close(c.done)
	c.spawnMu.Lock()
	c.stopping = true
	c.spawnMu.Unlock()
	err := c.ml.Shutdown()
	c.wg.Wait()
	// Deployments learned from peers are saved in the background; save
	// once more so nothing learned just before shutdown is lost.
	if serr := c.saveDeployments(); err == nil {
		err = serr
	}
	return err
}

// every runs fn every period on the cluster's clock, and whenever poke
// fires (nil: never), until Shutdown.
func (c *Cluster) every(period time.Duration, poke <-chan struct{}, fn func()) {
	t := c.cfg.Clock.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.Chan():
		case <-poke:
		}
		fn()
	}
}

// spawn runs fn in a goroutine unless the cluster is shutting down; the
// check and the WaitGroup add happen under one lock so Shutdown's Wait never
// races an Add.
// It reports whether fn was started.
func (c *Cluster) spawn(fn func()) bool {
	c.spawnMu.Lock()
	defer c.spawnMu.Unlock()
	if c.stopping {
		return false
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		fn()
	}()
	return true
}
