package gossip

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
)

// memberlistLog turns memberlist's "[LEVEL] memberlist: text" lines into
// structured records at the matching level, so that a wrong gossip key
// ("No installed keys could decrypt the message") shows up as an error in
// the node's own log rather than as free text.
type memberlistLog struct{ log *slog.Logger }

var memberlistLevels = []struct {
	prefix string
	level  slog.Level
}{{"[ERR]", slog.LevelError}, {"[WARN]", slog.LevelWarn}, {"[INFO]", slog.LevelInfo}, {"[DEBUG]", slog.LevelDebug}}

func (w memberlistLog) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		s := string(line)
		level := slog.LevelInfo
		for _, p := range memberlistLevels {
			if i := strings.Index(s, p.prefix); i >= 0 {
				level = p.level
				s = strings.TrimSpace(s[i+len(p.prefix):])
				break
			}
		}
		s = strings.TrimPrefix(s, "memberlist: ")
		if strings.Contains(s, "decrypt") || strings.Contains(s, "label") {
			s += " (hint: every node needs the same --gossip-key-file and cluster label)"
		}
		w.log.Log(context.Background(), level, s, "component", "memberlist")
	}
	return len(p), nil
}
