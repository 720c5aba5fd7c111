package publish

import (
	"math"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/probes/host"
)

// Hardware publishes the part of the record that follows the machine: the
// GPUs, the probe summary (driver faults among it) and telemetry. The GPU
// loop owns it.
type Hardware struct {
	record Record
	// telemetryAt is when telemetry was last read (zero: never).
	telemetryAt time.Time
}

// NewHardware publishes into record.
func NewHardware(record Record) *Hardware { return &Hardware{record: record} }

// TelemetryDue says whether to read telemetry now: the last reading is at
// least LoadInterval old. It notes now as the time of the reading it
// allows. Utilisation, temperature and power change at every sample;
// published at every GPU tick, each would be a full record sent to every
// node, and every node would reconcile on it. So they go out rounded and
// at most as often as engine load does, and never into placement's view
// (supervisor.BuildView reads no telemetry).
func (h *Hardware) TelemetryDue(now time.Time) bool {
	if !h.telemetryAt.IsZero() && now.Sub(h.telemetryAt) < LoadInterval {
		return false
	}
	h.telemetryAt = now
	return true
}

// Telemetry rounds a reading taken at now for the record, and says
// whether it differs from cur, what the record holds; when it does not,
// cur is returned (its time of reading stays).
func Telemetry(now time.Time, gpus []gpu.Telemetry, links []host.LinkRate, cur gossip.Telemetry) (gossip.Telemetry, bool) {
	t := gossip.Telemetry{GPUs: roundGPUTelemetry(gpus), Links: roundLinks(links)}
	if slices.Equal(t.GPUs, cur.GPUs) && slices.Equal(t.Links, cur.Links) {
		return cur, false
	}
	t.ReadAt = now
	return t, true
}

// Publish puts the GPUs and probe summary of the last reading in the
// record when they differ from was, what the record held when the reading
// began, beyond noise, and tel when it is not nil (a new telemetry
// reading, see Telemetry): one update for all. It reports whether the
// record changed.
func (h *Hardware) Publish(was gossip.NodeRecord, gpus []placement.GPU, probes gossip.ProbeSummary, tel *gossip.Telemetry) bool {
	if !GPUsChanged(was.GPUs, gpus) && SameProbes(probes, was.Probes) && tel == nil {
		return false
	}
	h.record.UpdateLocal(func(r *gossip.NodeRecord) {
		r.GPUs, r.Probes = gpus, probes
		if tel != nil {
			r.Telemetry = *tel
		}
	})
	return true
}

// GPUsChanged ignores memory churn under 256 MiB: re-gossiping every
// allocator wobble would flood the cluster for no placement decision.
func GPUsChanged(old, cur []placement.GPU) bool {
	if len(old) != len(cur) {
		return true
	}
	const q = 256 << 20
	for i := range old {
		a, b := old[i], cur[i]
		if a.UUID != b.UUID || a.Faulted != b.Faulted || a.MIG != b.MIG || a.MemoryTotal != b.MemoryTotal ||
			a.MemoryUsed/q != b.MemoryUsed/q || a.MemoryForeign/q != b.MemoryForeign/q {
			return true
		}
	}
	return false
}

// SameProbes compares probe summaries, the fault's time by the instant it
// names (== would also compare its location).
func SameProbes(a, b gossip.ProbeSummary) bool {
	ta, tb := a.LastDriverFaultAt, b.LastDriverFaultAt
	a.LastDriverFaultAt, b.LastDriverFaultAt = time.Time{}, time.Time{}
	return a == b && ta.Equal(tb)
}

// roundGPUTelemetry rounds utilisation to 5 %, temperature to 1 °C and
// power to 10 W: finer steps are noise to a person and churn to gossip.
func roundGPUTelemetry(ts []gpu.Telemetry) []gossip.GPUTelemetry {
	var out []gossip.GPUTelemetry
	for _, t := range ts {
		g := gossip.GPUTelemetry{Index: t.Index, NoUtil: !t.HasUtil, NoTemp: !t.HasTemp, NoPower: !t.HasPower}
		if t.HasUtil {
			g.UtilPct = min(100, max(0, int(math.Round(float64(t.UtilPct)/5)*5)))
		}
		if t.HasTemp {
			g.TempC = t.TempC
		}
		if t.HasPower {
			g.PowerW = max(0, int(math.Round(t.PowerW/10)*10))
		}
		out = append(out, g)
	}
	return out
}

// roundLinks rounds rates to 0.1 MB/s; a link's idle chatter (a few kB/s
// of management traffic) reads as 0.
func roundLinks(ls []host.LinkRate) []gossip.LinkRate {
	var out []gossip.LinkRate
	for _, l := range ls {
		out = append(out, gossip.LinkRate{Device: l.Device, Port: l.Port, Up: l.Up,
			TxMBps: math.Round(l.TxMBps*10) / 10, RxMBps: math.Round(l.RxMBps*10) / 10})
	}
	return out
}

// FaultLine makes a kernel line fit the record: printable, at most
// gossip.MaxFaultLine bytes, cut at a character boundary.
func FaultLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, strings.ToValidUTF8(s, "?"))
	if len(s) <= gossip.MaxFaultLine {
		return s
	}
	cut := gossip.MaxFaultLine - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
