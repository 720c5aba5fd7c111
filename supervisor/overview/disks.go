package overview

import (
	"errors"
	"os"
	"syscall"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/supervisor/datadir"
)

// LowFree is the share of a disk's space under which the Disks section
// highlights it.
const LowFree = 0.10

// DisksReader reads free and total space of the weights dir and the data
// dir.
type DisksReader struct {
	// WeightsDir overrides the stamp's --weights-dir.
	WeightsDir string
	// Statfs reads a file system's free (available to unprivileged
	// users) and total bytes (Statfs).
	Statfs func(path string) (free, total uint64, err error)
	// Clock times Read's bound. Nil: the real clock, which also bounds the
	// other sections of a frame (a test's Overview.Clock fixes the frame's
	// moment, not its bounds: a hung statfs must not wait for Advance).
	Clock clock.Clock
}

// DisksSection is what the Disks section shows.
type DisksSection struct{ Disks []Disk }

// Disk is one directory's file system.
type Disk struct {
	What, Path  string
	Free, Total uint64
	// Err is why it could not be read ("does not answer" for a statfs
	// past the bound, as a hung network mount gives).
	Err string
}

// Low reports whether less than LowFree of the disk is free.
func (d Disk) Low() bool {
	return d.Err == "" && d.Total > 0 && float64(d.Free) < LowFree*float64(d.Total)
}

// Read reads each directory's file system in its own goroutine, each
// bounded by limit: statfs on a network mount that went away does not
// return, and must not hold up the frame or the other disks.
func (r DisksReader) Read(d datadir.Dir, st stamp, limit time.Duration) DisksSection {
	statfs := r.Statfs
	if statfs == nil {
		statfs = Statfs
	}
	weights := r.WeightsDir
	if weights == "" {
		weights = st.alive.WeightsDir
	}
	disks := []Disk{{What: "data dir", Path: d.Root()}}
	if weights != "" {
		disks = append(disks, Disk{What: "weights", Path: weights})
	}
	type result struct {
		free, total uint64
		err         error
	}
	chans := make([]chan result, len(disks))
	for i := range disks {
		chans[i] = make(chan result, 1)
		go func(path string, ch chan<- result) {
			f, t, err := statfs(path)
			ch <- result{f, t, err}
		}(disks[i].Path, chans[i])
	}
	clk := r.Clock
	if clk == nil {
		clk = clock.Real()
	}
	deadline := clk.NewTimer(limit)
	defer deadline.Stop()
	for i := range disks {
		select {
		case res := <-chans[i]:
			disks[i].Free, disks[i].Total = res.free, res.total
			switch {
			case errors.Is(res.err, os.ErrNotExist):
				disks[i].Err = "not there"
			case res.err != nil:
				disks[i].Err = res.err.Error()
			}
		case <-deadline.Chan():
			// The timer fired once: every disk not yet answered is late.
			for j := i; j < len(disks); j++ {
				select {
				case res := <-chans[j]:
					disks[j].Free, disks[j].Total = res.free, res.total
					if res.err != nil {
						disks[j].Err = res.err.Error()
					}
				default:
					disks[j].Err = errNoAnswer.Error()
				}
			}
			return DisksSection{Disks: disks}
		}
	}
	return DisksSection{Disks: disks}
}

// Statfs is statfs(2): the bytes available to unprivileged users, and the
// file system's size.
func Statfs(path string) (free, total uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, 0, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize), nil
}
