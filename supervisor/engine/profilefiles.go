package engine

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/llmgw/llmgw/internal/atomicfile"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/profile"
)

// profileFilesDir is the directory of engine id's profile files (SGLang's
// --config YAML with its key): under the engines' cache dir, which
// containers see at the same path (the runtime bind-mounts it), so one
// path serves both runtimes. The directory is 0700 and each file 0600:
// only the agent's user (and root, which every container runs as) reads
// the key, where on the command line every local user could.
func profileFilesDir(cacheDir, id string) string {
	return filepath.Join(cacheDir, "files", id)
}

// writeProfileFiles renders prof's files for this start into in.FilesDir
// and writes each atomically, 0600. Rewritten at every start, so a changed
// key or spec reaches the engine; a profile without files writes nothing.
func writeProfileFiles(prof profile.Profile, spec placement.Deployment, in profile.Inputs) error {
	files, err := profile.Files(prof, spec, in)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return nil
	}
	if err := os.MkdirAll(in.FilesDir, 0o700); err != nil {
		return fmt.Errorf("engine files: %w", err)
	}
	// MkdirAll leaves an existing directory's mode alone.
	if err := os.Chmod(in.FilesDir, 0o700); err != nil {
		return fmt.Errorf("engine files: %w", err)
	}
	for name, content := range files {
		if err := atomicfile.Write(filepath.Join(in.FilesDir, name), []byte(content), 0o600); err != nil {
			return fmt.Errorf("engine files: %w", err)
		}
	}
	return nil
}
