// Package shardstate keeps one small JSON file per engine the supervisor
// runs, <dir>/shard-<shard id>.json, so that an agent restarted after a
// crash or kill -9 knows what it had started, with which spec, how often it
// restarted and when it claimed the shard.
//
// Files are written atomically: a temporary file in the same directory is
// written and fsynced, renamed over the target, and the directory is
// fsynced. A reader therefore sees the old or the new file, never a mix. What
// this does not cover: a disk that lies about fsync, and two processes
// writing one directory (one agent owns its work dir).
//
// Load never fails on a bad file: a corrupt or truncated one is reported and
// moved aside to <name>.corrupt-<n> so the next start is clean and the
// evidence is kept; temporary files left by a crash mid-write are removed.
// Read parses the same way and changes nothing, for a viewer: only the
// agent that owns the dir may clean it.
//
// Each file says which protocol's layout it is in ("protocol"; see
// internal/protocol): Protocol when this build wrote it. A file without
// the field was written by an agent from before protocol versions and
// reads as protocol 1, its fields as they were: an upgraded agent adopts
// the engines its predecessor started. A file of a protocol this build
// does not speak is reported and left in place; the agent's start-up
// check (datadir.CheckProtocol) refuses such a dir before Load runs.
package shardstate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmgw/llmgw/internal/atomicfile"
	"github.com/llmgw/llmgw/internal/protocol"
)

// FormatVersion is the layout version agents from before protocol
// versions check: they accept 1 and leave anything higher in place. It
// stays 1 while the layout stays readable by them (protocol 2 only added
// "protocol"), so going back to such an agent still adopts the engines; a
// release whose layout they could not read raises it with Protocol.
const FormatVersion = 1

// Protocol is the protocol whose layout this package writes. A release
// that changes the layout writes its own version here; one that does not
// keeps this number, so older agents still read its files.
const Protocol = protocol.V2

const (
	prefix = "shard-"
	suffix = ".json"
	// tmpMarker is what atomicfile puts in its temp names:
	// .shard-<id>.json.tmp-<random>.
	tmpMarker = ".tmp-"
)

// Spec is how the engine was started: the resolved profile and the
// runtime's handles.
type Spec struct {
	// Engine is the profile name (vllm, sglang, llamacpp, fake).
	Engine          string `json:"engine"`
	ServedModelName string `json:"served_model_name"`
	Model           string `json:"model,omitempty"`
	Deployment      string `json:"deployment,omitempty"`
	GPUIndices      []int  `json:"gpu_indices"`
	// MemoryPerGPU is the memory the shard was placed with on each GPU
	// (0: whole GPUs). An adopted engine reports it again, so placement
	// does not count its GPUs as taken whole after an agent restart.
	MemoryPerGPU uint64   `json:"memory_per_gpu_bytes,omitempty"`
	GPUUUIDs     []string `json:"gpu_uuids,omitempty"`
	HTTPPort     int      `json:"http_port"`
	// Private: the engine was started listening on loopback only (cluster
	// version 4 and above); gossip.ShardRecord.Private says so to the
	// cluster, after an agent restart too. Files from before the field
	// read false, which is what those engines were started with.
	Private bool `json:"private,omitempty"`
	// Role is the replica's role in a disaggregated deployment
	// (placement.RolePrefill or RoleDecode; "" in any other), and KVPort
	// the first of the block of ports it was given for the KV transfer:
	// vLLM's NIXL side channel (one port per tensor-parallel rank from
	// it) or an SGLang prefill's bootstrap port.
	Role        string   `json:"role,omitempty"`
	KVPort      int      `json:"kv_port,omitempty"`
	ReplicaID   string   `json:"replica_id"`
	SpecVersion string   `json:"spec_version"`
	Image       string   `json:"image,omitempty"`
	Command     []string `json:"command,omitempty"`
	// Runtime is the runtime's name ("containerd" or "process"); EngineID
	// is the runtime's ID for the engine, ContainerID the container's.
	Runtime     string `json:"runtime,omitempty"`
	EngineID    string `json:"engine_id"`
	ContainerID string `json:"container_id,omitempty"`
}

// State is one shard state file.
type State struct {
	// Protocol is the protocol whose layout the file is in: Protocol when
	// this build wrote it, 1 for a file from before the field.
	Protocol      int    `json:"protocol"`
	FormatVersion int    `json:"format_version"`
	ShardID       string `json:"shard_id"`
	ReplicaID     string `json:"replica_id"`
	// PID of the engine's main process on the host, 0 if unknown.
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"started_at"`
	Spec      Spec      `json:"spec"`
	// Restarts counts crashes restarted in place since the shard was
	// claimed; it drives the backoff.
	Restarts int `json:"restarts"`
	// LastExitCode is nil until the engine has exited once.
	LastExitCode *int      `json:"last_exit_code"`
	LastExitAt   time.Time `json:"last_exit_at,omitzero"`
	// ClaimStamp orders duplicate holders after a partition heals (see
	// placement.HeldShard).
	ClaimStamp int64 `json:"claim_stamp"`
	// Gang is the engine's place in a replica that spans nodes; nil for a
	// replica of one shard. An agent restarted on a member node finds the
	// generation its engine runs against here, so it keeps the engine
	// rather than restart it for a generation it forgot.
	Gang *Gang `json:"gang,omitempty"`
}

// Gang is one gang member's start: its rank and the gang's size, the
// generation it was started for, rank 0's rendezvous, and the node of
// every rank in that generation.
type Gang struct {
	Rank       int      `json:"rank"`
	Size       int      `json:"size"`
	Generation int64    `json:"generation"`
	MasterAddr string   `json:"master_addr"`
	MasterPort int      `json:"master_port"`
	Members    []string `json:"members,omitempty"`
}

// BadFile is a file Read or Load could not use.
type BadFile struct {
	Path string
	Err  error
	// MovedTo is where Load moved the file aside, empty if it was left in
	// place (by Read always; by Load when unreadable this time, of a newer
	// format, or the move failed).
	MovedTo string
}

func (b BadFile) Error() string {
	if b.MovedTo != "" {
		return fmt.Sprintf("%s: %v (moved to %s)", b.Path, b.Err, b.MovedTo)
	}
	return fmt.Sprintf("%s: %v", b.Path, b.Err)
}

// idPattern is DNS-label-ish, a little wider to allow dots; with the checks
// in ValidID it keeps every ID a single file name inside dir.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// ValidID reports whether id can name a shard state file: letters, digits,
// '.', '_' and '-', starting with a letter or digit, no "..", at most 253
// characters.
func ValidID(id string) error {
	if !idPattern.MatchString(id) || strings.Contains(id, "..") {
		return fmt.Errorf("shard id %q: want letters, digits, '.', '_' or '-', starting with a letter or digit, no '..' or '/', at most 253 characters", id)
	}
	return nil
}

// Path is the state file of shard id in dir.
func Path(dir, id string) (string, error) {
	if err := ValidID(id); err != nil {
		return "", err
	}
	return filepath.Join(dir, prefix+id+suffix), nil
}

// Save writes s atomically as the state file of s.ShardID, stamping this
// build's Protocol and FormatVersion. dir must exist. After an error the file holds
// either its previous content (or nothing, if there was none) or, when only
// the final directory sync failed, the new content, not yet durable.
//
// The file is named after the engine (Spec.EngineID, "<shard>-<spec
// version>") when it is set: during a rolling update the old and the new
// spec of one shard may both run on this node, and each needs its own file.
func Save(dir string, s State) error {
	p, err := Path(dir, FileID(s))
	if err != nil {
		return err
	}
	s.Protocol, s.FormatVersion = Protocol, FormatVersion
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("shard state %s: %w", s.ShardID, err)
	}
	b = append(b, '\n')
	if err := atomicfile.Write(p, b, 0o600); err != nil {
		return fmt.Errorf("shard state %s: %w", s.ShardID, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("shard state: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("shard state: fsync %s: %w", dir, err)
	}
	return nil
}

// FileID is the ID a state's file is named by: the engine ID when known,
// else the shard ID.
func FileID(s State) string {
	if s.Spec.EngineID != "" {
		return s.Spec.EngineID
	}
	return s.ShardID
}

// Read parses every state file in dir, sorted by shard ID, and changes
// nothing: a corrupt file stays where it is and a temporary file left by an
// interrupted Save is skipped. It is what a viewer uses while the agent is
// down (or up: a Save in flight is not seen half-written). A missing dir
// holds no states. Files it cannot use come back in bad, none moved; an
// unreadable dir is reported as one BadFile naming it.
func Read(dir string) (states []State, bad []BadFile) {
	sc := scanDir(dir, os.ReadFile)
	return sc.states, sc.bad
}

// Load is Read for the agent that owns dir, which also cleans it up:
// corrupt files are moved aside (so the next start is clean and the
// evidence kept) and temporary files left by an interrupted Save are
// removed, so it must not run while a Save in the same dir is in flight.
func Load(dir string) (states []State, bad []BadFile) { return load(dir, os.ReadFile) }

// load is Load with the file reader injected: tests make reads fail.
func load(dir string, readFile func(string) ([]byte, error)) (states []State, bad []BadFile) {
	sc := scanDir(dir, readFile)
	for _, name := range sc.temps {
		// Left by a Save that crashed before its rename: the target
		// still holds the previous state, so the temp file is noise.
		_ = os.Remove(filepath.Join(dir, name))
	}
	for i := range sc.bad {
		// Only a file whose content is wrong is moved aside. A file
		// that could not be read (EACCES, EIO, EMFILE) may be fine;
		// neither is one a newer agent wrote.
		var corrupt *corruptError
		if errors.As(sc.bad[i].Err, &corrupt) {
			sc.bad[i].MovedTo = moveAside(dir, filepath.Base(sc.bad[i].Path), sc.names)
		}
	}
	return sc.states, sc.bad
}

// scan is what one look at a state dir found; scanDir changes nothing.
type scan struct {
	states []State
	bad    []BadFile // none moved (MovedTo empty)
	// temps are the names of temporary files an interrupted Save left.
	temps []string
	// names holds every entry's name, for moveAside to pick a free one.
	names map[string]bool
}

func scanDir(dir string, readFile func(string) ([]byte, error)) scan {
	var sc scan
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return sc
		}
		sc.bad = []BadFile{{Path: dir, Err: err}}
		return sc
	}
	sc.names = make(map[string]bool, len(entries))
	for _, e := range entries {
		sc.names[e.Name()] = true
	}
	for _, e := range entries {
		name := e.Name()
		full := filepath.Join(dir, name)
		switch {
		case strings.HasPrefix(name, "."+prefix) && strings.Contains(name, suffix+tmpMarker):
			sc.temps = append(sc.temps, name)
		case strings.HasPrefix(name, prefix) && strings.HasSuffix(name, suffix) && e.Type().IsRegular():
			s, err := readState(readFile, full, strings.TrimSuffix(strings.TrimPrefix(name, prefix), suffix))
			if err != nil {
				sc.bad = append(sc.bad, BadFile{Path: full, Err: err})
				continue
			}
			sc.states = append(sc.states, s)
		}
	}
	slices.SortFunc(sc.states, func(a, b State) int { return strings.Compare(a.ShardID, b.ShardID) })
	return sc
}

// newerFormatError is a file a newer agent wrote in a layout this build
// does not know: it is left in place for that agent.
type newerFormatError struct{ what string }

func (e *newerFormatError) Error() string { return e.what + "; left in place" }

// corruptError marks a state file whose content is unusable.
type corruptError struct{ err error }

func (e *corruptError) Error() string { return "corrupt: " + e.err.Error() }
func (e *corruptError) Unwrap() error { return e.err }

func readState(readFile func(string) ([]byte, error), path, id string) (State, error) {
	b, err := readFile(path)
	if err != nil {
		return State{}, fmt.Errorf("read (left in place): %w", err)
	}
	s, err := decodeState(b, id)
	var newer *newerFormatError
	if err != nil && !errors.As(err, &newer) {
		err = &corruptError{err}
	}
	return s, err
}

func decodeState(b []byte, id string) (State, error) {
	var s State
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&s); err != nil {
		return State{}, err
	}
	if dec.More() {
		return State{}, errors.New("data after the JSON object")
	}
	switch {
	case s.Protocol > protocol.Max:
		return State{}, &newerFormatError{fmt.Sprintf("written by an llmgw of protocol %d; this llmgw speaks protocols %d to %d (install one that speaks protocol %d or later)",
			s.Protocol, protocol.Min, protocol.Max, s.Protocol)}
	case s.FormatVersion > FormatVersion:
		return State{}, &newerFormatError{fmt.Sprintf("format_version %d is newer than this agent's %d", s.FormatVersion, FormatVersion)}
	case s.Protocol < 0:
		return State{}, fmt.Errorf("protocol %d", s.Protocol)
	case s.FormatVersion < 1:
		return State{}, fmt.Errorf("format_version %d", s.FormatVersion)
	case FileID(s) != id:
		return State{}, fmt.Errorf("engine %q (shard %q) in the file named for %q", FileID(s), s.ShardID, id)
	}
	if s.Protocol == 0 {
		s.Protocol = protocol.V1 // the previous release's file
	}
	return s, nil
}

// moveAside renames a bad file to the first free <name>.corrupt-<n>. It
// returns "" if even that failed (the file then stays and is reported again
// next time, which is noisy but loses nothing).
func moveAside(dir, name string, taken map[string]bool) string {
	for n := 1; n < 10000; n++ {
		cand := name + ".corrupt-" + strconv.Itoa(n)
		if taken[cand] {
			continue
		}
		if _, err := os.Lstat(filepath.Join(dir, cand)); err == nil {
			continue
		}
		if err := os.Rename(filepath.Join(dir, name), filepath.Join(dir, cand)); err != nil {
			return ""
		}
		taken[cand] = true
		_ = syncDir(dir)
		return filepath.Join(dir, cand)
	}
	return ""
}

// Remove deletes the state file of shard id. A file already gone is not an
// error, so cleanup can be retried.
func Remove(dir, id string) error {
	p, err := Path(dir, id)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("shard state: %w", err)
	}
	return syncDir(dir)
}
