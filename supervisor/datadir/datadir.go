// Package datadir is the layout of an agent's data directory (--data-dir).
// Every file and directory the agent keeps there is named here, once:
//
//	node.json         the node's identity: name, boot epoch, known peers,
//	                  the cluster version it last saw active
//	deployments.json  the deployments the node has heard of, for a
//	                  whole-cluster restart (written by gossip)
//	token             the cluster token, when the agent generated it
//	renewal.json      when the node last renewed its leases
//	agent.json        the running agent's last-alive stamp (alive.go)
//	gossip.key        the gossip encryption key, when the agent generated
//	                  it (or an operator put the cluster's there)
//	shards/           one state file per engine (package shardstate)
//	logs/             each engine's output, <engine id>.log and .log.1
//	runtime/          the process runtime's records
//
// Its readers only read: a viewer can use them on a data dir whose agent is
// down (or running) and nothing there moves. Cleaning up, such as setting
// a corrupt shard state file aside, is the owning agent's (shardstate.Load).
//
// Every JSON file an agent of protocol 2 or later writes here (node.json,
// renewal.json, deployments.json, shards/) says at its top level which
// protocol's layout it is in ("protocol"); a file without the field was
// written by an agent from before protocol versions, and reads as
// protocol 1. A release that changes a file's layout writes its own
// version in that file; one that does not keeps writing the old number,
// so an older agent still reads it. CheckProtocol is the start-up check
// that keeps an agent off a data dir a newer one wrote.
//
// It imports nothing above the supervisor's leaf packages: whoever writes
// a file (gossip, the node) takes its path from here as a string.
package datadir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/llmgw/llmgw/internal/atomicfile"
	"github.com/llmgw/llmgw/internal/protocol"
	"github.com/llmgw/llmgw/supervisor/shardstate"
)

// Dir is one agent's data directory.
type Dir struct{ root string }

// New returns the data directory rooted at root. The paths it names are
// root's; New creates nothing.
func New(root string) Dir { return Dir{root: root} }

// Root is the directory itself.
func (d Dir) Root() string { return d.root }

// NodeFile is node.json, the node's identity (see Identity).
func (d Dir) NodeFile() string { return filepath.Join(d.root, "node.json") }

// DeploymentsFile is deployments.json, where gossip persists the
// deployments it has heard of.
func (d Dir) DeploymentsFile() string { return filepath.Join(d.root, "deployments.json") }

// TokenFile is where the agent keeps the cluster token it generated (or
// one put there for it) when no --token-file is given.
func (d Dir) TokenFile() string { return filepath.Join(d.root, "token") }

// GossipKeyFile is where the agent keeps the gossip key when no
// --gossip-key-file is given: the one it generated on starting a new
// cluster, or the cluster's key copied there for it.
func (d Dir) GossipKeyFile() string { return filepath.Join(d.root, "gossip.key") }

// ShardsDir holds the shard state files (package shardstate).
func (d Dir) ShardsDir() string { return filepath.Join(d.root, "shards") }

// RenewalFile is renewal.json: when this node last renewed its leases,
// so a restarted agent can tell whether they lapsed while it was away.
func (d Dir) RenewalFile() string { return filepath.Join(d.root, "renewal.json") }

// LogsDir holds the engines' logs.
func (d Dir) LogsDir() string { return filepath.Join(d.root, "logs") }

// EngineLogFile is where the runtime writes the stdout and stderr of
// engine id. When capped, the previous generation is <file>.1.
func (d Dir) EngineLogFile(id string) string { return filepath.Join(d.LogsDir(), id+".log") }

// RuntimeDir holds the process runtime's records of the engines it
// started (containerd keeps its own).
func (d Dir) RuntimeDir() string { return filepath.Join(d.root, "runtime") }

// ReadShardStates parses every shard state file, sorted by shard ID, and
// returns the good ones and, in bad, why each other one is unusable. It
// moves and deletes nothing (shardstate.Read): a corrupt file stays for
// the agent, whose shardstate.Load sets it aside.
func (d Dir) ReadShardStates() (states []shardstate.State, bad []shardstate.BadFile) {
	return shardstate.Read(d.ShardsDir())
}

// Identity is what a node remembers across restarts, in node.json.
type Identity struct {
	// Protocol is the protocol whose layout the file is in: IdentityProtocol
	// when this build wrote it, 1 for a file from before the field.
	Protocol int    `json:"protocol"`
	Name     string `json:"name"`
	// Epoch is bumped at every boot, so a run's records are newer than
	// any the cluster still holds from the last one.
	Epoch int64 `json:"epoch"`
	// Peers are the gossip addresses of the live members last seen, so a
	// restart finds the cluster without --join.
	Peers []string `json:"peers,omitempty"`
	// ActiveVersion is the cluster version this node last saw active
	// (gossip's active version), 0 before it saw one. It never goes down,
	// so a restarted node starts at it rather than at the lowest version
	// and does not run an older rule than its peers meanwhile.
	ActiveVersion int `json:"active_version,omitempty"`
}

// The protocol whose layout each file this package writes is in.
// Protocol 2 added the "protocol" field itself, and node.json's
// active_version (which an older agent ignores).
const (
	IdentityProtocol = protocol.V2
	RenewalProtocol  = protocol.V2
)

// ErrCorrupt is wrapped by the error of a reader whose file exists but
// does not parse.
var ErrCorrupt = errors.New("corrupt")

// NewerProtocolError is a file written by an llmgw whose protocol this
// build does not speak: its layout may differ from what this build knows,
// so an agent must neither use it nor write beside it.
type NewerProtocolError struct {
	Path     string
	Protocol int
}

func (e *NewerProtocolError) Error() string {
	return fmt.Sprintf("%s was written by an llmgw of protocol %d, and this llmgw speaks protocols %d to %d", e.Path, e.Protocol, protocol.Min, protocol.Max)
}

// fileProtocol checks the protocol a file says it is in: p when this
// build speaks it, protocol.V1 when the file does not say (the previous
// release wrote it), a *NewerProtocolError above protocol.Max, and a
// corrupt error for a value no llmgw writes.
func fileProtocol(path string, p int) (int, error) {
	switch {
	case p == 0:
		return protocol.V1, nil
	case p < 0:
		return 0, fmt.Errorf("%s is %w (protocol %d)", path, ErrCorrupt, p)
	case p > protocol.Max:
		return 0, &NewerProtocolError{Path: path, Protocol: p}
	}
	return p, nil
}

// ReadIdentity reads node.json and changes nothing. found is false, with
// no error, when there is no file (a node that never ran here). A file
// that does not parse is an error wrapping ErrCorrupt; one a newer llmgw
// wrote is a *NewerProtocolError.
func (d Dir) ReadIdentity() (id Identity, found bool, err error) {
	p := d.NodeFile()
	b, err := os.ReadFile(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Identity{}, false, nil
	case err != nil:
		return Identity{}, false, fmt.Errorf("read %s: %w", p, err)
	}
	if err := json.Unmarshal(b, &id); err != nil {
		return Identity{}, true, fmt.Errorf("%s is %w (%v)", p, ErrCorrupt, err)
	}
	if id.Protocol, err = fileProtocol(p, id.Protocol); err != nil {
		return Identity{}, true, err
	}
	return id, true, nil
}

// WriteIdentity replaces node.json with id, atomically, in this build's
// layout (IdentityProtocol, whatever id.Protocol says). It is the agent's:
// a viewer only reads.
func (d Dir) WriteIdentity(id Identity) error {
	id.Protocol = IdentityProtocol
	out, err := json.MarshalIndent(id, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(d.NodeFile(), out, 0o600)
}

// renewal is renewal.json's content.
type renewal struct {
	Protocol  int       `json:"protocol"`
	RenewedAt time.Time `json:"renewed_at"`
}

// ReadRenewal reads when the node last renewed its leases and changes
// nothing. found is false, with no error, when there is no file; a file
// that does not parse is an error wrapping ErrCorrupt, and one a newer
// llmgw wrote a *NewerProtocolError.
func (d Dir) ReadRenewal() (at time.Time, found bool, err error) {
	p := d.RenewalFile()
	b, err := os.ReadFile(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return time.Time{}, false, nil
	case err != nil:
		return time.Time{}, false, fmt.Errorf("read %s: %w", p, err)
	}
	var r renewal
	if err := json.Unmarshal(b, &r); err != nil {
		return time.Time{}, true, fmt.Errorf("%s is %w (%v)", p, ErrCorrupt, err)
	}
	if _, err := fileProtocol(p, r.Protocol); err != nil {
		return time.Time{}, true, err
	}
	return r.RenewedAt, true, nil
}

// WriteRenewal records that the node renewed its leases at t, atomically
// but without fsync (every TTL/3): after a power cut the file may say an
// older renewal or none, and a restarted agent then claims afresh, which is
// the safe side (and its engines died with the power anyway).
func (d Dir) WriteRenewal(t time.Time) error {
	b, err := json.Marshal(renewal{Protocol: RenewalProtocol, RenewedAt: t})
	if err != nil {
		return err
	}
	return atomicfile.Replace(d.RenewalFile(), b, 0o600)
}
