package supervisor

import (
	"context"
	"math"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/probes/gpu"
	"github.com/llmgw/llmgw/probes/host"
)

// telemetryDue reads GPU activity and interconnect rates when the last
// reading is at least loadPublishInterval old, and says whether the
// rounded result differs from what the record holds (cur). Utilisation,
// temperature and power change at every sample; published at every GPU
// tick, each would be a full record sent to every node, and every node
// would reconcile on it. So they go out rounded and at most as often as
// engine load does, and never into placement's view (BuildView reads no
// telemetry).
func (n *Node) telemetryDue(ctx context.Context, cur gossip.Telemetry) (gossip.Telemetry, bool) {
	now := n.clock.Now()
	if !n.telemetryRead.IsZero() && now.Sub(n.telemetryRead) < loadPublishInterval {
		return cur, false
	}
	n.telemetryRead = now
	var t gossip.Telemetry
	if r, ok := n.cfg.GPUs.(gpu.TelemetryReader); ok {
		ts, err := r.Telemetry(ctx)
		if err != nil {
			n.log.Debug("GPU telemetry read failed", "err", err)
		}
		t.GPUs = roundGPUTelemetry(ts)
	}
	if n.cfg.Interconnect != nil {
		ic, err := n.cfg.Interconnect(ctx)
		if err != nil {
			n.log.Debug("interconnect read failed", "err", err)
		}
		t.Links = roundLinks(ic.Links)
	}
	if slices.Equal(t.GPUs, cur.GPUs) && slices.Equal(t.Links, cur.Links) {
		return cur, false
	}
	t.ReadAt = now
	return t, true
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

// faultLine makes a kernel line fit the record: printable, at most
// gossip.MaxFaultLine bytes, cut at a character boundary.
func faultLine(s string) string {
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
