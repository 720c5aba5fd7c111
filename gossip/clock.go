package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Clocks are part of correctness once stamps and epochs are bounded by
// MaxClockOffset (validate.go), so each node estimates how far its clock is
// from its peers', and says so when it is far.
//
// The estimate rides on memberlist's probes: every ack carries the sender's
// wall time, and the prober knows the round trip, so (as in NTP) the peer's
// clock minus ours is about theirs − (receive time − rtt/2). Probes reach
// every member round-robin, and they are not queued the way broadcasts are,
// so a sample is never seconds stale.

// ErrClockOutOfBounds is wrapped by the error of a write refused because
// this node's clock is more than MaxClockOffset off the cluster's.
var ErrClockOutOfBounds = errors.New("clock out of bounds")

const (
	// clockPayloadV1 tags an ack payload: the sender's wall time, Unix
	// ns, big-endian.
	clockPayloadV1 byte = 1
	// clockWindow samples per peer; the estimate is their median, so one
	// ack delayed by a busy host does not move it.
	clockWindow = 5
	// clockSampleTTL drops the estimate of a peer not probed for this
	// long: its clock may have been fixed (or broken) since. Probes reach
	// each of n members every n probe intervals.
	clockSampleTTL = 10 * time.Minute
	// clockWarnEvery repeats the warning while the clock stays off.
	clockWarnEvery = time.Minute
)

// How far this node's clock is off the cluster's.
const (
	clockFine = iota
	clockFar  // past half of MaxClockOffset: warned
	clockOut  // past MaxClockOffset: writes refused
)

// clockSamples are the last offsets measured to one peer: their clock
// minus ours.
type clockSamples struct {
	offsets []time.Duration
	at      time.Time // this node's clock at the last sample
}

func (s *clockSamples) add(d time.Duration, at time.Time) {
	if len(s.offsets) == clockWindow {
		s.offsets = s.offsets[1:]
	}
	s.offsets = append(s.offsets, d)
	s.at = at
}

// median of ds; the mean of the two middle values for an even count.
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return s[len(s)/2-1] + (s[len(s)/2]-s[len(s)/2-1])/2
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// fmtOffset writes an offset as "+0.1s" or "-42s".
func fmtOffset(d time.Duration) string {
	if abs(d) < 10*time.Second {
		return fmt.Sprintf("%+.1fs", d.Seconds())
	}
	return fmt.Sprintf("%+.0fs", d.Seconds())
}

// clockView computes, under c.mu, every clock's offset from the
// cluster's: the cluster's clock is the median of this node's (offset 0)
// and each live peer's estimate. n counts the peers behind it; with none,
// nothing is known. Taking the median, one wrong clock (even this node's)
// does not move the others'.
func (c *Cluster) clockView(now time.Time) (self time.Duration, peers map[string]time.Duration, n int) {
	est := map[string]time.Duration{}
	all := []time.Duration{0}
	for name, s := range c.clocks {
		info, ok := c.members[name]
		if !ok || info.state != StateAlive || len(s.offsets) == 0 || now.Sub(s.at) > clockSampleTTL {
			continue
		}
		d := median(s.offsets)
		est[name] = d
		all = append(all, d)
	}
	if len(est) == 0 {
		return 0, nil, 0
	}
	m := median(all)
	for name, d := range est {
		est[name] = d - m
	}
	return -m, est, len(est)
}

// ClockOffset is this node's clock minus the cluster's, and the number of
// peers the estimate rests on (0: no estimate yet, as on a node alone).
func (c *Cluster) ClockOffset() (time.Duration, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	self, _, n := c.clockView(c.cfg.Clock.Now())
	return self, n
}

// checkClockForWrite refuses a local write while this node's clock is
// beyond MaxClockOffset of the cluster's: its stamp would be refused (if
// ahead) by every peer, or lose to writes made before it (if behind). The
// error says so, here, rather than the write vanishing elsewhere.
func (c *Cluster) checkClockForWrite() error {
	off, n := c.ClockOffset()
	if n == 0 || abs(off) <= MaxClockOffset {
		return nil
	}
	return fmt.Errorf("%w: this node's clock is %s off the cluster's (the median of its own and %d peers' clocks), beyond the %s bound, so peers would refuse or misorder this write; fix this host's time sync (chrony, NTP) or write through another node",
		ErrClockOutOfBounds, fmtOffset(off), n, MaxClockOffset)
}

// sampleClock takes one probe's measurement of a peer's clock.
func (c *Cluster) sampleClock(peer string, rtt time.Duration, payload []byte) {
	if len(payload) != 9 || payload[0] != clockPayloadV1 {
		// An older agent sends none; anything else is not ours.
		if len(payload) > 0 {
			c.drops[DropMalformed].Add(1)
		}
		return
	}
	theirs := time.Unix(0, int64(binary.BigEndian.Uint64(payload[1:])))
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	if c.clocks == nil {
		c.clocks = map[string]*clockSamples{}
	}
	s := c.clocks[peer]
	if s == nil {
		s = &clockSamples{}
		c.clocks[peer] = s
	}
	s.add(theirs.Sub(now.Add(-rtt/2)), now)
	self, _, n := c.clockView(now)
	// Past half the bound a write of this node may already be refused by
	// a peer whose clock leans the other way: warn from there. Said again
	// every clockWarnEvery, and at once when it gets worse.
	level := clockFine
	switch {
	case abs(self) > MaxClockOffset:
		level = clockOut
	case abs(self) > MaxClockOffset/2:
		level = clockFar
	}
	say := level != clockFine && (level > c.clockLevel || now.Sub(c.clockWarnedAt) >= clockWarnEvery)
	back := level == clockFine && c.clockLevel != clockFine
	if say {
		c.clockWarnedAt = now
	}
	c.clockLevel = level
	c.mu.Unlock()
	switch {
	case say && level == clockOut:
		c.log.Error("this node's clock is off the cluster's beyond the bound: its places and unplaces are refused, and peers refuse records stamped by it; fix its time sync (chrony, NTP)",
			"offset", fmtOffset(self), "bound", MaxClockOffset, "peers", n)
	case say:
		c.log.Warn("this node's clock is off the cluster's by more than half the bound: some peers may refuse its writes; fix its time sync (chrony, NTP)",
			"offset", fmtOffset(self), "bound", MaxClockOffset, "peers", n)
	case back:
		c.log.Info("this node's clock is back within half the bound of the cluster's", "offset", fmtOffset(self), "peers", n)
	}
}
