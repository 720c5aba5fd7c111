package gossip

import (
	"fmt"
	"math"
	"time"

	"github.com/hashicorp/memberlist"
)

// Profile is a named set of memberlist timings.
type Profile struct {
	Name string
	base func() *memberlist.Config
}

// Profiles are the timings `--profile` may name.
var profiles = []Profile{
	{
		Name: "lan",
		base: memberlist.DefaultLANConfig,
	},
	{
		Name: "local",
		base: localConfig,
	},
}

func localConfig() *memberlist.Config {
	c := memberlist.DefaultLocalConfig()
	c.ProbeInterval = 200 * time.Millisecond
	c.ProbeTimeout = 100 * time.Millisecond
	// SuspicionMult 2 asks for no independent confirmations, so the
	// suspicion timer is its minimum: 2 × probe interval on small clusters.
	c.SuspicionMult = 2
	c.SuspicionMaxTimeoutMult = 3
	c.GossipInterval = 50 * time.Millisecond
	c.GossipNodes = 4
	// Each node that learns a delta sends it RetransmitMult×ceil(log10(n+1))
	// times. With 3 (memberlist's local default) a 50-node cluster missed
	// some node in about one change in ten (≈ n·e^-6), leaving it to
	// push/pull; 4, the LAN default, brings that to about one in a hundred.
	c.RetransmitMult = 4
	c.PushPullInterval = 5 * time.Second
	c.TCPTimeout = time.Second
	c.IndirectChecks = 1
	c.GossipToTheDeadTime = 5 * time.Second
	return c
}

// ProfileByName returns the profile called name.
func ProfileByName(name string) (Profile, error) {
	for _, p := range profiles {
		if p.Name == name {
			return p, nil
		}
	}
	return Profile{}, fmt.Errorf("unknown profile %q: want lan or local", name)
}

// Config returns a fresh memberlist configuration with the profile's
// timings.
func (p Profile) Config() *memberlist.Config { return p.base() }

// DetectionBound is how long, at most, an n-node cluster with this profile
// takes to declare a silently dead node dead everywhere: every live node
// probes round-robin, so the dead one is probed within n probe intervals; the
// probe times out; suspicion runs to at most its maximum; then the dead
// message gossips to everyone within a few gossip rounds. It is an upper
// bound for tests, not the typical time.
func (p Profile) DetectionBound(n int) time.Duration {
	c := p.base()
	nodeScale := math.Max(1, math.Log10(math.Max(1, float64(n))))
	suspicion := time.Duration(float64(c.SuspicionMult) * nodeScale * float64(c.ProbeInterval))
	maxSuspicion := time.Duration(c.SuspicionMaxTimeoutMult) * suspicion
	probe := time.Duration(n)*c.ProbeInterval + c.ProbeTimeout
	return probe + maxSuspicion + p.SpreadBound(n) + 2*c.ProbeInterval
}

// SpreadBound is how long a change gossiped by one node of an n-node
// cluster takes, at most, to reach every other: a few gossip rounds per
// tenfold of nodes. Like DetectionBound it is a bound, not the typical
// time.
func (p Profile) SpreadBound(n int) time.Duration {
	c := p.base()
	return time.Duration(4*math.Ceil(math.Log10(float64(max(n, 1)+1)))+4) * c.GossipInterval
}

// PushPullEvery is how often each node of a cluster of n exchanges its
// whole state with a random peer under this profile: memberlist stretches
// the interval past 32 nodes, by one interval per doubling
// (memberlist's pushPullScale).
func (p Profile) PushPullEvery(n int) time.Duration {
	c := p.base()
	if n <= 32 {
		return c.PushPullInterval
	}
	return time.Duration(math.Ceil(math.Log2(float64(n))-math.Log2(32))+1) * c.PushPullInterval
}
