package weights

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// MaxCached bounds the models one scan reports, so a directory of
// thousands of files cannot grow a node record past what gossip carries.
const MaxCached = 256

// Cached is one model a weights directory holds.
type Cached struct {
	// Model is what a deployment names to use it: ORG/NAME for the hub
	// cache, the directory name of a plain model directory, the file name
	// of a .gguf file.
	Model string `json:"model"`
	// Bytes is its size on disk (the hub cache's blobs, not its links).
	Bytes uint64 `json:"bytes"`
	// Path is where it is, for this node only; it never travels.
	Path string `json:"-"`
}

// Scan lists the models under dir: hub cache directories
// (models--ORG--NAME, also under hub/ as HF_HOME lays them out), plain
// model directories (with a config.json) and .gguf files. It reads
// directory entries and file sizes only. A missing dir is no models.
func Scan(dir string) ([]Cached, error) {
	var out []Cached
	for _, d := range []string{dir, filepath.Join(dir, "hub")} {
		entries, err := os.ReadDir(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("weights directory %s: %w", d, err)
		}
		for _, e := range entries {
			name, path := e.Name(), filepath.Join(d, e.Name())
			if strings.HasPrefix(name, ".") {
				continue
			}
			var model string
			switch {
			case e.Type().IsRegular() && strings.HasSuffix(name, ".gguf"):
				model = name
			case !e.IsDir():
				continue
			case strings.HasPrefix(name, "models--"):
				org, repo, ok := strings.Cut(strings.TrimPrefix(name, "models--"), "--")
				if !ok || !ValidRepo(org+"/"+repo) {
					continue
				}
				if _, err := os.Stat(filepath.Join(path, "snapshots")); err != nil {
					continue
				}
				model = org + "/" + repo
			default:
				if _, err := os.Stat(filepath.Join(path, "config.json")); err != nil {
					continue
				}
				model = name
			}
			out = append(out, Cached{Model: model, Bytes: diskSize(path), Path: path})
		}
	}
	slices.SortFunc(out, func(a, b Cached) int { return strings.Compare(a.Model, b.Model) })
	out = slices.CompactFunc(out, func(a, b Cached) bool { return a.Model == b.Model })
	if len(out) > MaxCached {
		out = out[:MaxCached]
	}
	return out, nil
}

// ModelSize is the bytes on disk of model under dir (see Find), links not
// followed, and whether it is there. A download in progress grows it: the
// hub writes its blobs, .incomplete ones included, inside the model's own
// directory, so a caller watching one model walks that directory only.
func ModelSize(dir, model string) (uint64, bool) {
	path, ok := Find(dir, model)
	if !ok {
		return 0, false
	}
	return diskSize(path), true
}

// diskSize adds up the regular files under path without following links:
// a hub cache snapshot links into blobs/, which are counted once.
func diskSize(path string) uint64 {
	var n uint64
	_ = filepath.WalkDir(path, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			n += uint64(info.Size())
		}
		return nil
	})
	return n
}

// Find is where model lies under dir: a hub cache directory for ORG/NAME,
// a plain directory or a .gguf file of that name. The name cannot leave
// dir. ok is false when it is not there.
func Find(dir, model string) (path string, ok bool) {
	if dir == "" || model == "" || strings.Contains(model, "..") || strings.ContainsAny(model, "\\\x00") || filepath.IsAbs(model) {
		return "", false
	}
	var cands []string
	if ValidRepo(model) {
		hub := "models--" + strings.ReplaceAll(model, "/", "--")
		cands = append(cands, filepath.Join(dir, hub), filepath.Join(dir, "hub", hub), filepath.Join(dir, filepath.Base(model)))
	} else if !strings.Contains(model, "/") {
		cands = append(cands, filepath.Join(dir, model))
	}
	for _, c := range cands {
		if _, err := os.Stat(c); err == nil {
			return c, true
		}
	}
	return "", false
}
