package gossip

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/internal/atomicfile"
	"github.com/llmgw/llmgw/internal/protocol"
)

// persistLoop saves deployments learned from peers (receive signals
// c.persist), off memberlist's goroutines, and forgets expired tombstones
// hourly, on the cluster's clock.
func (c *Cluster) persistLoop() {
	gc := c.cfg.Clock.NewTicker(time.Hour)
	defer gc.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-gc.Chan():
			c.store.GC()
		case <-c.persist:
			if err := c.saveDeployments(); err != nil {
				c.log.Error("persist deployments", "err", err)
			}
		}
	}
}

// deploymentsOnDisk is deployments.json: the store's deployment records,
// each in the bytes it travels in (fields this build does not know are
// kept), and the protocol version whose format the file is in.
type deploymentsOnDisk struct {
	// Protocol is absent (0) in the files of agents before this release,
	// which wrote {"format_version": 1, "deployments": [...]}: they read
	// as protocol 1, whose layout is this one. A release that changes the
	// file's layout writes its own version here.
	Protocol    int               `json:"protocol,omitempty"`
	Deployments []json.RawMessage `json:"deployments"`
}

// deploymentsFileProtocol is the protocol whose format this build writes
// deployments.json in.
const deploymentsFileProtocol = protocol.V2

func (c *Cluster) saveDeployments() error {
	c.saveMu.Lock()
	defer c.saveMu.Unlock()
	return c.writeDeployments(c.store.depEntries())
}

// findDeployment finds the record named name in deps, sorted by name.
func findDeployment(deps []depEntry, name string) (depEntry, bool) {
	i, found := slices.BinarySearchFunc(deps, name, func(d depEntry, name string) int {
		return strings.Compare(d.rec.Name, name)
	})
	if !found {
		return depEntry{}, false
	}
	return deps[i], true
}

// withDeployment returns deps, sorted by name, with r in place of the
// record of the same name. r is a local change with a fresh stamp, so it
// supersedes whatever is held.
func withDeployment(deps []depEntry, r depEntry) []depEntry {
	i, found := slices.BinarySearchFunc(deps, r.rec.Name, func(d depEntry, name string) int {
		return strings.Compare(d.rec.Name, name)
	})
	if found {
		deps[i] = r
		return deps
	}
	return slices.Insert(deps, i, r)
}

// writeDeployments writes deps to the deployments file atomically; the
// caller holds saveMu.
func (c *Cluster) writeDeployments(deps []depEntry) error {
	if c.cfg.DeploymentsFile == "" {
		return nil
	}
	file := deploymentsOnDisk{Protocol: deploymentsFileProtocol, Deployments: make([]json.RawMessage, len(deps))}
	for i, d := range deps {
		if file.Deployments[i] = d.raw; d.raw == nil {
			file.Deployments[i] = rawOf(d.rec)
		}
	}
	// Indented for people; each record is compacted again on load, so
	// that the bytes it travels in stay those it arrived in. No HTML
	// escaping: it would rewrite a record's "<" as "\u003c".
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(file); err != nil {
		return fmt.Errorf("persist deployments: %w", err)
	}
	return atomicfile.Write(c.cfg.DeploymentsFile, b.Bytes(), 0o600)
}

func (c *Cluster) loadDeployments() error {
	if c.cfg.DeploymentsFile == "" {
		return nil
	}
	p := c.cfg.DeploymentsFile
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load deployments: %w", err)
	}
	recs, bad, err := parseDeployments(b, p)
	if err != nil {
		return err
	}
	// A bad record is left out, as it would be from a peer: the file may
	// come from an older agent, or have been edited by hand.
	for _, r := range bad {
		c.refuse(DropMalformedRecord, r.what, fmt.Errorf("%s in %s: %w", r.what, p, r.err), "file", p)
	}
	now := c.cfg.Clock.Now()
	for _, r := range recs {
		if reason, err := checkDeployment(r.rec, now); err != nil {
			c.refuse(reason, "deployment "+r.rec.Name, err, "file", p)
			continue
		}
		c.hlc.Witness(r.rec.Stamp)
		c.store.mergeDeployment(r)
	}
	return nil
}

// parseDeployments reads the records of deployments.json at path, each
// with its bytes, and lists those that do not decode in bad. A file that
// does not parse, or that an llmgw of a newer protocol wrote, stops the
// start, naming the file and the fix; the records it holds are checked
// one by one by the caller, as a peer's are.
func parseDeployments(b []byte, path string) (recs []depEntry, bad []badRecord, err error) {
	var d deploymentsOnDisk
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, nil, fmt.Errorf("load deployments from %s: %w (move the file aside to start without them; peers will send theirs)", path, err)
	}
	switch {
	case d.Protocol > protocol.Max:
		// Its layout may be one this build cannot read, and this agent
		// would write its own over it: refuse before either.
		return nil, nil, fmt.Errorf("load deployments from %s: the file is in protocol %d, written by a newer llmgw, and this llmgw speaks protocols %d to %d; "+
			"run an llmgw that speaks protocol %d or later (llmgw version prints the range a binary speaks); nothing on disk was changed",
			path, d.Protocol, protocol.Min, protocol.Max, d.Protocol)
	case d.Protocol < 0:
		return nil, nil, fmt.Errorf("load deployments from %s: protocol %d is no protocol version (move the file aside to start without them; peers will send theirs)", path, d.Protocol)
	}
	for i, raw := range d.Deployments {
		var r DeploymentRecord
		if err := unmarshalRecord(raw, &r); err != nil {
			bad = append(bad, badRecord{what: recordName("deployment", raw, i, len(d.Deployments)), err: err})
			continue
		}
		// The file is indented; the record travels compact, as it came.
		var compact bytes.Buffer
		if err := json.Compact(&compact, raw); err != nil {
			bad = append(bad, badRecord{what: recordName("deployment", raw, i, len(d.Deployments)), err: err})
			continue
		}
		recs = append(recs, depEntry{rec: r, raw: compact.Bytes()})
	}
	return recs, bad, nil
}
