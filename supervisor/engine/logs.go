package engine

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// LogPath returns the log file of the newest engine of shard on this node.
func (r *Runner) LogPath(shard string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var best *managed
	for _, e := range r.engines {
		if e.state.ShardID == shard && (best == nil || e.state.StartedAt.After(best.state.StartedAt)) {
			best = e
		}
	}
	if best == nil {
		return "", false
	}
	return r.cfg.DataDir.EngineLogFile(best.id), true
}

// logLoop caps the engines' log files every LogCheck until the runner
// closes.
func (r *Runner) logLoop() {
	defer r.wg.Done()
	tick := r.cfg.Clock.NewTicker(r.cfg.LogCheck)
	defer tick.Stop()
	for {
		select {
		case <-r.quit:
			return
		case <-tick.Chan():
		}
		r.mu.Lock()
		ids := make([]string, 0, len(r.engines))
		for id := range r.engines {
			ids = append(ids, id)
		}
		r.mu.Unlock()
		for _, id := range ids {
			// logMu orders this with finish removing the log: a cap must
			// not recreate <log>.1 after the engine's logs are gone.
			r.logMu.Lock()
			r.mu.Lock()
			_, live := r.engines[id]
			r.mu.Unlock()
			if live {
				if err := capLog(r.cfg.DataDir.EngineLogFile(id), r.cfg.MaxLogBytes); err != nil {
					r.log.Warn("cap engine log", "engine", id, "err", err)
				}
			}
			r.logMu.Unlock()
		}
	}
}

// capLog copies a log over limit to <path>.1 (replacing the previous
// generation) and empties it in place. The file is not renamed: the
// engine's writer (our process runtime, or containerd's shim) keeps its
// descriptor, opened O_APPEND, so its next write lands at the new end.
// Lines written between the copy and the truncation are lost, the usual
// price of copytruncate for a writer that cannot be told to reopen.
func capLog(path string, limit int64) error {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && st.Size() <= limit) {
		return nil
	}
	if err != nil {
		return err
	}
	src, err := os.Open(path)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp := path + ".1.tmp"
	dst, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		os.Remove(tmp)
		return fmt.Errorf("copy to %s: %w", tmp, err)
	}
	if err := dst.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path+".1"); err != nil {
		return err
	}
	return os.Truncate(path, 0)
}
