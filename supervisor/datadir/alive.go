package datadir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/llmgw/llmgw/internal/atomicfile"
)

// AliveFile is agent.json: the running agent's last-alive stamp, which it
// rewrites every few seconds. A viewer on the machine (llmgw overview)
// reads it to find the agent's API and log file, and to say since when an
// agent that does not answer has been silent.
func (d Dir) AliveFile() string { return filepath.Join(d.root, "agent.json") }

// Alive is agent.json's content.
type Alive struct {
	// At is when the agent last wrote the stamp.
	At time.Time `json:"alive_at"`
	// StartedAt is when this agent process started.
	StartedAt time.Time `json:"started_at"`
	PID       int       `json:"pid"`
	// Name is the node's name.
	Name    string `json:"name,omitempty"`
	Version string `json:"version,omitempty"`
	// API is the host:port a viewer on this machine dials for the agent's
	// HTTP API (a wildcard listen address written as loopback).
	API string `json:"api,omitempty"`
	// LogFile is where `node up --log-file` writes the agent's log; empty
	// when it logs to stderr (the journal, under systemd).
	LogFile string `json:"log_file,omitempty"`
	// WeightsDir is --weights-dir, empty when none was given.
	WeightsDir string `json:"weights_dir,omitempty"`
	// SimulatedGPUs is --simulate-gpus, so a viewer shows the GPUs the
	// node advertises (marked simulated) where NVML has none.
	SimulatedGPUs string `json:"simulated_gpus,omitempty"`
}

// Validate checks what a viewer would act on: it dials API and opens
// LogFile, so a damaged or hand-edited stamp must not point it elsewhere
// than an address and absolute, clean paths.
func (a Alive) Validate() error {
	if a.API != "" {
		if _, _, err := net.SplitHostPort(a.API); err != nil {
			return fmt.Errorf("api %q: want host:port", a.API)
		}
	}
	for _, p := range []struct{ field, v string }{{"log_file", a.LogFile}, {"weights_dir", a.WeightsDir}} {
		if p.v != "" && (!filepath.IsAbs(p.v) || filepath.Clean(p.v) != p.v) {
			return fmt.Errorf("%s %q: want an absolute, clean path", p.field, p.v)
		}
	}
	if a.PID < 0 {
		return fmt.Errorf("pid %d: want 0 or more", a.PID)
	}
	return nil
}

// WriteAlive replaces agent.json with a, atomically: a viewer reads the
// old stamp or the new, never half of one. Not durably (it is rewritten
// every few seconds): after a power cut the stamp may be older, or gone,
// which a viewer shows as an agent silent since then, or none.
func (d Dir) WriteAlive(a Alive) error {
	if err := a.Validate(); err != nil {
		return fmt.Errorf("%s: %w", d.AliveFile(), err)
	}
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return atomicfile.Replace(d.AliveFile(), b, 0o600)
}

// ReadAlive reads agent.json and changes nothing. found is false, with no
// error, when there is none (no agent ever ran here, or an older one). A
// file that does not parse or fails Validate is an error wrapping
// ErrCorrupt.
func (d Dir) ReadAlive() (a Alive, found bool, err error) {
	p := d.AliveFile()
	b, err := os.ReadFile(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Alive{}, false, nil
	case err != nil:
		return Alive{}, false, fmt.Errorf("read %s: %w", p, err)
	}
	if err := json.Unmarshal(b, &a); err != nil {
		return Alive{}, true, fmt.Errorf("%s is %w (%v)", p, ErrCorrupt, err)
	}
	if err := a.Validate(); err != nil {
		return Alive{}, true, fmt.Errorf("%s is %w (%v)", p, ErrCorrupt, err)
	}
	return a, true, nil
}
