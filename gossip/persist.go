package gossip

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/internal/atomicfile"
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

type deploymentsOnDisk struct {
	FormatVersion int                `json:"format_version"`
	Deployments   []DeploymentRecord `json:"deployments"`
}

func (c *Cluster) saveDeployments() error {
	c.saveMu.Lock()
	defer c.saveMu.Unlock()
	return c.writeDeployments(c.store.Deployments())
}

// findDeployment finds the record named name in deps, sorted by name.
func findDeployment(deps []DeploymentRecord, name string) (DeploymentRecord, bool) {
	i, found := slices.BinarySearchFunc(deps, name, func(d DeploymentRecord, name string) int {
		return strings.Compare(d.Name, name)
	})
	if !found {
		return DeploymentRecord{}, false
	}
	return deps[i], true
}

// withDeployment returns deps, sorted by name, with r in place of the
// record of the same name. r is a local change with a fresh stamp, so it
// supersedes whatever is held.
func withDeployment(deps []DeploymentRecord, r DeploymentRecord) []DeploymentRecord {
	i, found := slices.BinarySearchFunc(deps, r.Name, func(d DeploymentRecord, name string) int {
		return strings.Compare(d.Name, name)
	})
	if found {
		deps[i] = r
		return deps
	}
	return slices.Insert(deps, i, r)
}

// writeDeployments writes deps to the deployments file atomically; the
// caller holds saveMu.
func (c *Cluster) writeDeployments(deps []DeploymentRecord) error {
	if c.cfg.DeploymentsFile == "" {
		return nil
	}
	b, err := json.MarshalIndent(deploymentsOnDisk{FormatVersion: 1, Deployments: deps}, "", "  ")
	if err != nil {
		return fmt.Errorf("persist deployments: %w", err)
	}
	return atomicfile.Write(c.cfg.DeploymentsFile, b, 0o600)
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
	recs, err := parseDeployments(b, p)
	if err != nil {
		return err
	}
	// A bad record is left out, as it would be from a peer: the file may
	// come from an older agent, or have been edited by hand.
	now := c.cfg.Clock.Now()
	for _, r := range recs {
		if reason, err := checkDeployment(r, now); err != nil {
			c.refuse(reason, "deployment "+r.Name, err, "file", p)
			continue
		}
		c.hlc.Witness(r.Stamp)
		c.store.MergeDeployment(r)
	}
	return nil
}

// parseDeployments reads the records of deployments.json at path. A file
// that does not parse stops the start, naming the file and the fix; the
// records it holds are checked one by one by the caller, as a peer's are.
func parseDeployments(b []byte, path string) ([]DeploymentRecord, error) {
	var d deploymentsOnDisk
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("load deployments from %s: %w (move the file aside to start without them; peers will send theirs)", path, err)
	}
	return d.Deployments, nil
}
