package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"

	"github.com/llmgw/llmgw/supervisor/overview"
)

// screenModel is a full-screen view (llmgw overview, llmgw top): what read
// returns, drawn by draw for the window's width, read again every every,
// one read at a time, scrolled by the arrows; q quits.
type screenModel struct {
	read  func(context.Context) any
	draw  func(v any, width int) string
	dim   lipgloss.Style
	every time.Duration
	// what is shown until the first read answers; keys is the last line.
	what, keys string

	data          any
	read1         bool
	busy          bool
	width, height int
	offset        int
}

// runScreen runs m full screen on w until q or ctx ends.
func runScreen(ctx context.Context, w io.Writer, m screenModel) error {
	p := tea.NewProgram(m, tea.WithAltScreen(), tea.WithContext(ctx), tea.WithOutput(w))
	if _, err := p.Run(); err != nil && !errors.Is(err, tea.ErrProgramKilled) && ctx.Err() == nil {
		return err
	}
	return nil
}

type screenDataMsg struct{ v any }

type screenTickMsg struct{}

func (m screenModel) readCmd() tea.Cmd {
	return func() tea.Msg { return screenDataMsg{m.read(context.Background())} }
}

func (m screenModel) tick() tea.Cmd {
	return tea.Tick(m.every, func(time.Time) tea.Msg { return screenTickMsg{} })
}

func (m screenModel) Init() tea.Cmd { return tea.Batch(m.readCmd(), m.tick()) }

func (m screenModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.KeyMsg:
		switch msg.String() {
		case "q", "Q", "ctrl+c", "esc":
			return m, tea.Quit
		case "up", "k":
			m.offset--
		case "down", "j":
			m.offset++
		case "pgup":
			m.offset -= max(1, m.height-2)
		case "pgdown", " ":
			m.offset += max(1, m.height-2)
		case "home", "g":
			m.offset = 0
		}
		m.offset = m.clamp(m.offset)
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
		m.offset = m.clamp(m.offset)
	case screenDataMsg:
		m.data, m.read1, m.busy = msg.v, true, false
		m.offset = m.clamp(m.offset)
	case screenTickMsg:
		// One read at a time: a slow source is read as fast as it
		// answers, never by a pile of reads.
		if m.busy || !m.read1 {
			return m, m.tick()
		}
		m.busy = true
		return m, tea.Batch(m.readCmd(), m.tick())
	}
	return m, nil
}

// lines is the data drawn for the window's width.
func (m screenModel) lines() []string {
	if !m.read1 {
		return []string{m.what}
	}
	return strings.Split(strings.TrimSuffix(m.draw(m.data, m.width), "\n"), "\n")
}

// clamp keeps the scroll within the lines; the screen's last line is the
// keys.
func (m screenModel) clamp(off int) int {
	room := max(1, m.height-1)
	return max(0, min(off, len(m.lines())-room))
}

func (m screenModel) View() string {
	lines := m.lines()
	room := len(lines)
	if m.height > 1 {
		room = m.height - 1
	}
	end := min(len(lines), m.offset+room)
	shown := lines[min(m.offset, end):end]
	for len(shown) < room {
		shown = append(shown, "")
	}
	return strings.Join(shown, "\n") + "\n" + m.dim.Render(overview.Cut(m.keys, m.width))
}
