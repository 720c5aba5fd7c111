// Package atomicfile writes files so that a reader (or the next agent after
// a crash) sees either the old content or the new, never a torn mix.
//
// The sequence is: write a temp file in the same directory, fsync it, rename
// it over the target, fsync the directory. Rename is atomic within one file
// system; the directory fsync makes the rename itself durable. It does not
// protect against a disk that lies about fsync. Replace is the same without
// the fsyncs, for files written every few seconds whose loss in a power cut
// errs on the safe side.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces path with data, atomically and durably. An error means the
// old content is still in place, except when the last step, the directory
// sync after the rename, fails: the new content is then in place but may
// not survive a power cut.
func Write(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, true)
}

// Replace replaces path with data atomically but not durably: a reader,
// and the next agent after the process crashed, sees the old content or
// the new; after a power cut the file may hold either, or be empty or
// gone. For files rewritten every few seconds whose readers take a missing
// or unreadable file as the safe case: agent.json's fsyncs alone were about
// a tenth of an idle agent's CPU (a --debug-addr profile).
func Replace(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, false)
}

func write(path string, data []byte, perm os.FileMode, durable bool) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmpName := tmp.Name()
	cleanup := func() { _ = os.Remove(tmpName) }
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		cleanup()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		cleanup()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if durable {
		if err := tmp.Sync(); err != nil {
			tmp.Close()
			cleanup()
			return fmt.Errorf("write %s: fsync: %w", path, err)
		}
	}
	if err := tmp.Close(); err != nil {
		cleanup()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmpName, path); err != nil {
		cleanup()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if !durable {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("write %s: open dir for fsync: %w", path, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("write %s: fsync dir: %w", path, err)
	}
	return nil
}
