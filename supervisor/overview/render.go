package overview

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/supervisor/status"
)

// Render draws a frame for a screen width columns wide (0: no limit).
// Every line fits the width; the terminal view scrolls the lines.
func Render(f Frame, width int, st Styles) string {
	var b strings.Builder
	r := renderer{b: &b, w: width, st: st, now: f.At}
	self := f.Peers.Self
	if self == "" {
		self = "this machine"
	}
	r.line(st.Title.Render("llmgw overview") + "  " + self + "  " + f.At.Local().Format("15:04:05"))
	r.agent(f.Agent)
	r.peers(f.Peers)
	r.gpus(f.GPUs)
	r.engines(f.Engines)
	r.disks(f.Disks)
	r.problems(f.Problems)
	if root := needsRoot(f); len(root) > 0 {
		r.blank()
		r.line(st.Warn.Render("Run with sudo to read " + strings.Join(root, ", ") + "."))
	}
	return b.String()
}

// needsRoot lists what this user could not read, once each.
func needsRoot(f Frame) []string {
	var out []string
	out = append(out, f.Agent.NeedsRoot...)
	if f.Peers.NeedsRoot {
		out = append(out, "node.json (the remembered peers)")
	}
	if f.Engines.NeedsRoot {
		out = append(out, "the shard state files")
	}
	out = append(out, f.Problems.NeedsRoot...)
	return slices.Compact(out)
}

type renderer struct {
	b   *strings.Builder
	w   int
	st  Styles
	now time.Time
}

func (r renderer) line(s string)          { r.b.WriteString(Cut(s, r.w) + "\n") }
func (r renderer) blank()                 { r.b.WriteString("\n") }
func (r renderer) note(s string)          { r.line("  " + r.st.Dim.Render(s)) }
func (r renderer) warn(s string)          { r.line("  " + r.st.Warn.Render(s)) }
func (r renderer) table(t Table)          { r.b.WriteString(t.Render(r.w, "  ", r.st)) }
func (r renderer) head(s string)          { r.blank(); r.line(r.st.Title.Render(s)) }
func (r renderer) kv(k, v string)         { r.line(fmt.Sprintf("  %-12s ", k) + v) }
func (r renderer) ago(t time.Time) string { return Ago(r.now.Sub(t)) + " ago" }

func (r renderer) agent(a AgentSection) {
	r.head("Agent")
	if a.Note != "" {
		r.warn(a.Note)
		return
	}
	switch {
	case a.ServiceNote != "":
		r.kv("service", r.st.Dim.Render(a.ServiceNote))
	default:
		state := a.ActiveState
		if a.SubState != "" {
			state += " (" + a.SubState + ")"
		}
		if a.ActiveState == "active" {
			state = r.st.OK.Render(state)
		} else {
			state = r.st.Bad.Render(state)
		}
		if !a.ActiveSince.IsZero() {
			state += " since " + a.ActiveSince.Local().Format("2006-01-02 15:04:05") + ", " + r.ago(a.ActiveSince)
		}
		r.kv("service", state)
	}
	if a.APIErr == "" {
		r.kv("API", a.APIAddr+" "+r.st.OK.Render("answers"))
	} else {
		msg := a.APIAddr + " " + r.st.Bad.Render("does not answer") + " (" + a.APIErr + ")"
		if a.Stamp != nil && !a.Stamp.At.IsZero() {
			msg = r.st.Bad.Render("agent does not answer since "+a.Stamp.At.Local().Format("15:04:05")) + " (" + r.ago(a.Stamp.At) + "; " + a.APIAddr + ": " + a.APIErr + ")"
		}
		r.kv("API", msg)
	}
	if s := a.Stamp; s != nil {
		proc := r.st.OK.Render("pid " + strconv.Itoa(s.PID))
		if a.PIDGone {
			proc = r.st.Bad.Render("pid " + strconv.Itoa(s.PID) + " gone")
		}
		line := proc + ", llmgw " + dash(s.Version)
		if !s.StartedAt.IsZero() {
			line += ", started " + s.StartedAt.Local().Format("2006-01-02 15:04:05")
		}
		line += ", last alive " + r.ago(s.At)
		r.kv("agent", line)
	} else if a.StampNote != "" {
		r.kv("agent", r.st.Dim.Render(a.StampNote))
	}
	r.kv("this binary", "llmgw "+dash(a.Version))
	r.kv("data dir", a.DataDir)
}

// state is a peer's or engine's state word in its tone (status.StateTone,
// as the page and top draw it), or else dimmed, drawn as none.
func (r renderer) state(word, none string) Cell {
	if style, ok := r.st.Tone(status.StateTone(word)); ok {
		return S(word, style)
	}
	return S(none, r.st.Dim)
}

func (r renderer) peers(p PeersSection) {
	if p.FromAgent {
		r.head("Peers (as the agent knows them)")
	} else {
		r.head("Peers (remembered in node.json)")
	}
	if p.Note != "" {
		r.note(p.Note)
	}
	if len(p.Peers) == 0 {
		if p.FromAgent {
			r.note("none: this node is alone in its cluster")
		}
		return
	}
	t := Table{Head: []string{"NAME", "GOSSIP", "STATE", "GOSSIP PORT"}, Flex: -1}
	for _, x := range p.Peers {
		state := r.state(x.State, dash(x.State))
		port := S("reachable", r.st.OK)
		if x.DialErr != "" {
			port = S(x.DialErr, r.st.Bad)
		}
		t.Rows = append(t.Rows, []Cell{C(dash(x.Name)), C(x.Addr), state, port})
	}
	r.table(t)
}

func (r renderer) gpus(g GPUsSection) {
	title := "GPUs (NVML"
	if g.Driver != "" {
		title += ", driver " + g.Driver
	}
	if g.Simulated {
		title = "GPUs (simulated: the agent runs with --simulate-gpus"
	}
	r.head(title + ")")
	if len(g.GPUs) == 0 {
		r.note(dash(g.Note))
		return
	}
	xidHead := "XID"
	if g.FaultWindow > 0 {
		xidHead = "XID (" + Ago(g.FaultWindow) + ")"
	}
	t := Table{Head: []string{"GPU", "NAME", "MEMORY", "UTIL", "TEMP", "POWER", "MIG", xidHead, "MODELS"}, Flex: -1}
	for _, x := range g.GPUs {
		util, temp, power := "-", "-", "-"
		mig := "off"
		if x.MIG {
			mig = "on"
		}
		if rd := x.Reading; rd != nil {
			if rd.UtilPercent >= 0 {
				util = fmt.Sprintf("%.0f%%", rd.UtilPercent)
			}
			if rd.TempC >= 0 {
				temp = fmt.Sprintf("%.0f°C", rd.TempC)
			}
			if rd.PowerW >= 0 {
				power = fmt.Sprintf("%.0fW", rd.PowerW)
			}
			if len(rd.MIGInstances) > 0 {
				mig += " " + strings.Join(rd.MIGInstances, ",")
			}
		}
		xid := C("-")
		if x.RecentXids > 0 {
			xid = S(strconv.Itoa(x.RecentXids), r.st.Bad)
		}
		name := C(dash(x.Name))
		if x.Lost {
			name = S(dash(x.Name)+" (lost)", r.st.Bad)
		}
		models := S("free", r.st.Dim)
		if len(x.Models) > 0 {
			models = C(strings.Join(x.Models, ", "))
		}
		mem := "-"
		if x.MemTotal > 0 {
			mem = fmt.Sprintf("%.1f/%.1f GiB", gib(x.MemUsed), gib(x.MemTotal))
		}
		t.Rows = append(t.Rows, []Cell{C(strconv.Itoa(x.Index)), name, C(mem), C(util), C(temp), C(power), C(mig), xid, models})
	}
	r.table(t)
	if g.Note != "" {
		r.note(g.Note)
	}
}

func (r renderer) engines(e EnginesSection) {
	r.head("Engines (shard state files)")
	if e.Note != "" {
		r.warn(e.Note)
	}
	switch {
	case len(e.Engines) == 0 && e.NeedsRoot:
		r.warn("run with sudo to read the shard state files")
	case len(e.Engines) == 0 && e.Note == "":
		r.note("none on this machine")
	}
	if len(e.Engines) > 0 {
		t := Table{Head: []string{"SHARD", "MODEL", "ENGINE", "GPUS", "PORT", "PID", "UP", "LEASE"}, Flex: 1}
		for _, x := range e.Engines {
			pid := S(strconv.Itoa(x.PID)+" alive", r.st.OK)
			if !x.PIDAlive {
				pid = S(strconv.Itoa(x.PID)+" gone", r.st.Bad)
			}
			if x.PID == 0 {
				pid = S("-", r.st.Dim)
			}
			up := "-"
			if !x.StartedAt.IsZero() && x.PIDAlive {
				up = Ago(r.now.Sub(x.StartedAt))
			}
			lease := r.state(x.Lease, "-")
			if x.Status != "" && x.Status != "ready" {
				lease.Text += " (" + x.Status + ")"
			}
			gpus := "CPU"
			if len(x.GPUs) > 0 {
				gpus = ints(x.GPUs)
			}
			port := "-"
			if x.Port > 0 {
				port = strconv.Itoa(x.Port)
			}
			t.Rows = append(t.Rows, []Cell{C(x.Shard), C(dash(x.Model)), C(dash(x.Engine)), C(gpus), C(port), pid, C(up), lease})
		}
		r.table(t)
	}
	if e.LeaseNote != "" {
		r.note(e.LeaseNote)
	}
	for _, b := range e.Bad {
		r.warn(b)
	}
}

func (r renderer) disks(d DisksSection) {
	r.head("Disks")
	t := Table{Head: []string{"WHAT", "PATH", "FREE"}, Flex: 1, MinFlex: 12}
	for _, x := range d.Disks {
		free := C(fmt.Sprintf("%s free of %s (%.0f%%)", size(x.Free), size(x.Total), pct(x.Free, x.Total)))
		switch {
		case x.Err != "":
			free = S(x.Err, r.st.Bad)
		case x.Low():
			free = S(free.Text+", under 10% free", r.st.Bad)
		}
		t.Rows = append(t.Rows, []Cell{C(x.What), C(x.Path), free})
	}
	r.table(t)
}

func (r renderer) problems(p ProblemsSection) {
	r.head("Recent problems (last hour, " + p.Source + ")")
	switch {
	case p.Note != "":
		r.note(p.Note)
	case len(p.Lines) == 0 && agentRoot(p.NeedsRoot):
		r.warn("run with sudo to read the agent's warnings")
	case len(p.Lines) == 0:
		r.line("  " + r.st.OK.Render("no warnings or errors from the agent"))
	}
	for _, l := range p.Lines {
		style := r.st.Warn
		if strings.Contains(l, " ERROR ") {
			style = r.st.Bad
		}
		r.line("  " + style.Render(l))
	}
	what := "kernel, NVIDIA driver"
	if p.FaultWindow > 0 {
		what += ", last " + Ago(p.FaultWindow)
	}
	if p.FaultSource != "" {
		what += ", " + p.FaultSource
	}
	switch {
	case slices.Contains(p.NeedsRoot, "the kernel log"):
		r.line("  " + what + ": " + r.st.Warn.Render("run with sudo to read the kernel log"))
	case p.FaultNote != "":
		r.line("  " + what + ": " + r.st.Dim.Render(p.FaultNote))
	case len(p.Faults) == 0:
		r.line("  " + what + ": " + r.st.OK.Render("none"))
	default:
		r.line("  " + what + ":")
		for _, l := range p.Faults {
			r.line("    " + r.st.Bad.Render(l))
		}
	}
}

// agentRoot reports whether the agent's own log is among what needs root.
func agentRoot(what []string) bool {
	for _, w := range what {
		if strings.HasPrefix(w, "the agent's") {
			return true
		}
	}
	return false
}

// Ago is a duration as people say it: 3d4h, 2h15m, 4m10s, 15m, 40s.
func Ago(d time.Duration) string {
	d = d.Round(time.Second)
	two := func(a int64, ua string, b int64, ub string) string {
		if b == 0 {
			return fmt.Sprintf("%d%s", a, ua)
		}
		return fmt.Sprintf("%d%s%d%s", a, ua, b, ub)
	}
	switch {
	case d < 0:
		return "0s"
	case d >= 24*time.Hour:
		return two(int64(d/(24*time.Hour)), "d", int64(d%(24*time.Hour)/time.Hour), "h")
	case d >= time.Hour:
		return two(int64(d/time.Hour), "h", int64(d%time.Hour/time.Minute), "m")
	case d >= time.Minute:
		return two(int64(d/time.Minute), "m", int64(d%time.Minute/time.Second), "s")
	}
	return fmt.Sprintf("%ds", d/time.Second)
}

func gib(b uint64) float64 { return float64(b) / (1 << 30) }

func pct(part, whole uint64) float64 {
	if whole == 0 {
		return 0
	}
	return 100 * float64(part) / float64(whole)
}

// size is a byte count in binary units.
func size(n uint64) string {
	switch {
	case n >= 1<<40:
		return fmt.Sprintf("%.1f TiB", float64(n)/(1<<40))
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ints(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
