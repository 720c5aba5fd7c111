package datadir

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/llmgw/llmgw/internal/protocol"
)

// CheckProtocol is an agent's first look at its data dir, before it
// writes anything there: it refuses a dir that an llmgw of a newer
// protocol wrote (the operator went back to an older binary). That agent's
// files may be laid out in ways this build cannot read; rewriting node.json
// or moving a shard state file aside it cannot parse would destroy what
// the newer agent left, engines' claims included. The error names every
// such file, its protocol, this build's range and the fix.
//
// It reads only each file's top-level "protocol": a file that is missing,
// unreadable or does not parse is its own reader's to report, later.
func (d Dir) CheckProtocol() error {
	files := []string{d.NodeFile(), d.RenewalFile(), d.DeploymentsFile()}
	if entries, err := os.ReadDir(d.ShardsDir()); err == nil {
		for _, e := range entries {
			// shardstate's files only: its temp files start with a dot
			// and moved-aside ones end in .corrupt-<n>.
			if n := e.Name(); strings.HasPrefix(n, "shard-") && strings.HasSuffix(n, ".json") && e.Type().IsRegular() {
				files = append(files, filepath.Join(d.ShardsDir(), n))
			}
		}
	}
	var newer []*NewerProtocolError
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var head struct {
			Protocol int `json:"protocol"`
		}
		if json.Unmarshal(b, &head) != nil {
			continue
		}
		if _, err := fileProtocol(p, head.Protocol); err != nil {
			if n, ok := err.(*NewerProtocolError); ok {
				newer = append(newer, n)
			}
		}
	}
	if len(newer) == 0 {
		return nil
	}
	need := slices.MaxFunc(newer, func(a, b *NewerProtocolError) int { return a.Protocol - b.Protocol }).Protocol
	var what []string
	for _, n := range newer {
		rel, err := filepath.Rel(d.root, n.Path)
		if err != nil {
			rel = n.Path
		}
		what = append(what, fmt.Sprintf("%s (protocol %d)", rel, n.Protocol))
	}
	return fmt.Errorf("--data-dir %s was written by a newer llmgw: %s; this llmgw speaks protocols %d to %d. "+
		"Install an llmgw that speaks protocol %d or later (llmgw version prints the range a binary speaks); "+
		"this agent changed nothing in the data dir",
		d.root, strings.Join(what, ", "), protocol.Min, protocol.Max, need)
}
