// Package overview reads one machine for its own screen, `llmgw overview`
// (and a bare `sudo llmgw` on a node): the agent's service state, its
// peers, the GPUs, the engines, the disks and the recent problems, and
// draws them as one frame.
//
// It owns the readers and the drawing; cmd/llmgw owns the terminal. Every
// section but the peers' gossip states comes from this machine alone (the
// data dir, systemd, NVML, statfs, the journal), because the operator who
// opens it is often asking why the agent or the network broke. Each reader
// takes its paths and command runners as fields, so a test reads a
// directory and fake command outputs of its own. Commands are fixed, with
// fixed arguments. Each section is read in its own goroutine under one
// bound (Timeout, 2 s), so the slowest section bounds the frame and one
// that hangs (a dead NFS mount, a wedged driver) says "does not answer"
// while the rest is shown.
//
// The readers only read: nothing in the data dir moves (datadir's readers).
package overview

import (
	"context"
	"errors"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/probes/host"
	"github.com/llmgw/llmgw/supervisor/datadir"
)

// Timeout bounds each section of a frame.
const Timeout = 2 * time.Second

// ServiceName is the systemd unit `llmgw node install` writes.
const ServiceName = "llmgw"

// errNoAnswer is a section that ran past its bound.
var errNoAnswer = errors.New("does not answer")

// Runner runs a fixed command with fixed arguments (host.ExecRunner).
type Runner = host.Runner

// Frame is one reading of the machine.
type Frame struct {
	At       time.Time
	Agent    AgentSection
	Peers    PeersSection
	GPUs     GPUsSection
	Engines  EnginesSection
	Disks    DisksSection
	Problems ProblemsSection
}

// Overview reads every section. Build one with the readers' fields set;
// zero Clock and Timeout get the real clock and Timeout.
type Overview struct {
	Dir      datadir.Dir
	Clock    clock.Clock
	Timeout  time.Duration
	Agent    AgentReader
	Peers    PeersReader
	GPUs     GPUsReader
	Engines  EnginesReader
	Disks    DisksReader
	Problems ProblemsReader
	Faults   FaultsReader
}

// Read reads one frame. It returns within about twice the timeout whatever
// the sources do: once for the agent's stamp (a local file, which every
// section may need), once for the sections, all at once.
func (o Overview) Read(ctx context.Context) Frame {
	clk, limit := o.Clock, o.Timeout
	if clk == nil {
		clk = clock.Real()
	}
	if limit <= 0 {
		limit = Timeout
	}
	st, err := bounded(ctx, limit, func(context.Context) stamp { return readStamp(o.Dir) })
	if err != nil {
		st = stamp{err: "the data dir " + err.Error()}
	}
	var (
		wg       sync.WaitGroup
		f        Frame
		faults   faultReading
		disks    DisksSection
		sections = []func(){
			func() {
				f.Agent = section(ctx, limit, func(ctx context.Context) AgentSection { return o.Agent.Read(ctx, st, clk.Now()) },
					func(err error) AgentSection { return AgentSection{Note: "systemd and the agent's API " + err.Error()} })
			},
			func() {
				f.Peers = section(ctx, limit, func(ctx context.Context) PeersSection { return o.Peers.Read(ctx, o.Dir, st) },
					func(err error) PeersSection { return PeersSection{Note: "the peers " + err.Error()} })
			},
			func() {
				f.GPUs = section(ctx, limit, func(ctx context.Context) GPUsSection { return o.GPUs.Read(ctx, st) }, func(err error) GPUsSection { return GPUsSection{Note: "NVML " + err.Error()} })
			},
			func() {
				f.Engines = section(ctx, limit, func(ctx context.Context) EnginesSection { return o.Engines.Read(ctx, o.Dir, st) },
					func(err error) EnginesSection { return EnginesSection{Note: "the shard state files " + err.Error()} })
			},
			func() {
				f.Problems = section(ctx, limit, func(ctx context.Context) ProblemsSection { return o.Problems.Read(ctx, st, clk.Now()) },
					func(err error) ProblemsSection { return ProblemsSection{Note: "the agent's log " + err.Error()} })
			},
			func() {
				faults = section(ctx, limit, o.Faults.Read, func(err error) faultReading { return faultReading{err: "the kernel log " + err.Error()} })
			},
			// Disks bounds each path itself, so one hung mount leaves the
			// others readable.
			func() { disks = o.Disks.Read(o.Dir, st, limit) },
		}
	)
	for _, s := range sections {
		wg.Add(1)
		go func() { defer wg.Done(); s() }()
	}
	wg.Wait()
	f.Disks = disks
	now := clk.Now()
	f.GPUs.addEngines(f.Engines.Engines)
	f.GPUs.addFaults(faults, now)
	f.Problems.addFaults(faults, now)
	f.At = now
	return f
}

// section reads one section under the bound, or says why it could not.
func section[T any](ctx context.Context, limit time.Duration, read func(context.Context) T, late func(error) T) T {
	v, err := bounded(ctx, limit, read)
	if err != nil {
		return late(err)
	}
	return v
}

// bounded runs f with a context that ends after limit, and returns
// errNoAnswer if f has not returned by then. f keeps running in its
// goroutine (a statfs or an NVML call cannot be cancelled) and its result
// is dropped: nothing it touches is shared.
func bounded[T any](ctx context.Context, limit time.Duration, f func(context.Context) T) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	done := make(chan T, 1)
	go func() { done <- f(ctx) }()
	select {
	case v := <-done:
		return v, nil
	case <-ctx.Done():
		var zero T
		return zero, errNoAnswer
	}
}

// part gives a step of a section share of what remains of its bound, so
// a hung API call ends in time for the section to show its local part.
func part(ctx context.Context, share float64) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, time.Duration(share*float64(time.Until(dl))))
}

// stamp is the agent's last-alive stamp as one frame read it.
type stamp struct {
	alive datadir.Alive
	found bool
	// err says why it could not be read (root's, corrupt).
	err string
	// root is set when it was the permission that stopped the read.
	root bool
}

func readStamp(d datadir.Dir) stamp {
	a, found, err := d.ReadAlive()
	switch {
	case errors.Is(err, os.ErrPermission):
		return stamp{err: "the data dir is root's", root: true}
	case err != nil:
		return stamp{err: err.Error()}
	}
	return stamp{alive: a, found: found}
}

// PIDAlive reports whether a process with this pid exists (EPERM: it
// does, and is another user's).
func PIDAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
