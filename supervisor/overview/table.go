package overview

import (
	"io"
	"strings"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/ansi"
	"github.com/muesli/termenv"

	"github.com/llmgw/llmgw/supervisor/status"
)

// Styles colour the terminal views (this overview and llmgw top). Plain
// styles draw no escape codes at all, for --once, pipes and tests.
type Styles struct {
	Title, Head, OK, Warn, Bad, Dim lipgloss.Style
	// Color is false for plain styles.
	Color bool
}

// Plain draws text only.
func Plain() Styles {
	r := lipgloss.NewRenderer(io.Discard)
	r.SetColorProfile(termenv.Ascii)
	s := r.NewStyle()
	return Styles{Title: s, Head: s, OK: s, Warn: s, Bad: s, Dim: s}
}

// Colored draws for the terminal w, in the colours it supports.
func Colored(w io.Writer) Styles { return StylesFor(lipgloss.NewRenderer(w)) }

// StylesFor draws with r's colour profile.
func StylesFor(r *lipgloss.Renderer) Styles {
	return Styles{
		Title: r.NewStyle().Bold(true),
		Head:  r.NewStyle().Bold(true).Foreground(lipgloss.AdaptiveColor{Light: "238", Dark: "252"}),
		OK:    r.NewStyle().Foreground(lipgloss.Color("2")),
		Warn:  r.NewStyle().Foreground(lipgloss.Color("3")),
		Bad:   r.NewStyle().Foreground(lipgloss.Color("1")).Bold(true),
		Dim:   r.NewStyle().Faint(true),
		Color: true,
	}
}

// Tone is the style of a state's tone: the terminal's side of the one
// palette (status.Tone; the cluster page maps the same tones to its CSS
// classes). ToneNone has no style: ok is false.
func (s Styles) Tone(t status.Tone) (style lipgloss.Style, ok bool) {
	switch t {
	case status.ToneOK:
		return s.OK, true
	case status.ToneWarn:
		return s.Warn, true
	case status.ToneBad:
		return s.Bad, true
	case status.ToneIdle:
		return s.Dim, true
	}
	return lipgloss.Style{}, false
}

// State is a cell of a node, shard or lease state word in its tone's style
// (status.StateTone); a word that is no state is plain.
func (s Styles) State(word string) Cell {
	if style, ok := s.Tone(status.StateTone(word)); ok {
		return S(word, style)
	}
	return C(word)
}

// Cell is one table cell: its text and how it is drawn.
type Cell struct {
	Text  string
	Style *lipgloss.Style
}

// C is a plain cell.
func C(text string) Cell { return Cell{Text: text} }

// S is a cell drawn in style.
func S(text string, style lipgloss.Style) Cell { return Cell{Text: text, Style: &style} }

// Table draws rows in columns as wide as their widest cell, two spaces
// apart. When the table is wider than the screen, the Flex column (a
// reason, a message) is cut with an ellipsis first, down to MinFlex, and
// then every line is cut at the screen's edge: a row never wraps.
type Table struct {
	Head []string
	Rows [][]Cell
	// Flex is the column to cut first; -1 for the last one.
	Flex    int
	MinFlex int
	// Optional columns are left out, in this order, when cutting Flex is
	// not enough.
	Optional []int
}

// Render draws the table for a screen width columns wide (0: no limit),
// each line after indent.
func (t Table) Render(width int, indent string, st Styles) string {
	n := len(t.Head)
	for _, r := range t.Rows {
		n = max(n, len(r))
	}
	if n == 0 {
		return ""
	}
	widths := make([]int, n)
	for i, h := range t.Head {
		widths[i] = lipgloss.Width(h)
	}
	for _, r := range t.Rows {
		for i, c := range r {
			widths[i] = max(widths[i], lipgloss.Width(c.Text))
		}
	}
	flex := t.Flex
	if flex < 0 || flex >= n {
		flex = n - 1
	}
	shown := make([]bool, n)
	for i := range shown {
		shown[i] = true
	}
	if width > 0 {
		total := func() int {
			sum, cols := lipgloss.Width(indent), 0
			for i, w := range widths {
				if shown[i] {
					sum, cols = sum+w, cols+1
				}
			}
			return sum + 2*max(0, cols-1)
		}
		if over := total() - width; over > 0 {
			// Cut down to MinFlex (8 if unset), never widened by it.
			minFlex := min(widths[flex], max(t.MinFlex, 8))
			widths[flex] = max(minFlex, widths[flex]-over)
		}
		for _, o := range t.Optional {
			if total() <= width {
				break
			}
			if o >= 0 && o < n && o != flex {
				shown[o] = false
			}
		}
	}
	var b strings.Builder
	line := func(cells []Cell, head bool) {
		var l strings.Builder
		l.WriteString(indent)
		last := n - 1
		for last > 0 && !shown[last] {
			last--
		}
		for i := range n {
			if !shown[i] {
				continue
			}
			var c Cell
			if i < len(cells) {
				c = cells[i]
			}
			text := c.Text
			if lipgloss.Width(text) > widths[i] {
				text = ansi.Truncate(text, widths[i], "…")
			}
			pad := widths[i] - lipgloss.Width(text)
			switch {
			case head:
				text = st.Head.Render(text)
			case c.Style != nil:
				text = c.Style.Render(text)
			}
			l.WriteString(text)
			if i < last {
				l.WriteString(strings.Repeat(" ", pad+2))
			}
		}
		s := strings.TrimRight(l.String(), " ")
		if width > 0 && lipgloss.Width(s) > width {
			s = ansi.Truncate(s, width, "…")
		}
		b.WriteString(s + "\n")
	}
	if len(t.Head) > 0 {
		head := make([]Cell, len(t.Head))
		for i, h := range t.Head {
			head[i] = C(h)
		}
		line(head, true)
	}
	for _, r := range t.Rows {
		line(r, false)
	}
	return b.String()
}

// Cut shortens one line to width columns with an ellipsis (0: no limit).
func Cut(s string, width int) string {
	if width > 0 && lipgloss.Width(s) > width {
		return ansi.Truncate(s, width, "…")
	}
	return s
}
