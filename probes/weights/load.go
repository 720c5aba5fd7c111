package weights

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/llmgw/llmgw/placement/fit"
)

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// Load reads a model's headers from files. gguf, if not empty, names the
// GGUF file to read; otherwise the model is config.json and safetensors.
func Load(ctx context.Context, files Files, gguf string) (fit.Model, error) {
	if gguf != "" {
		return ReadGGUF(ctx, files, gguf)
	}
	b, err := files.ReadFile(ctx, "config.json", maxConfig)
	if isNotFound(err) {
		return fit.Model{}, fmt.Errorf("%s: no config.json: want a model directory (config.json and safetensors files) or a .gguf file", files.Where())
	}
	if err != nil {
		return fit.Model{}, fmt.Errorf("%s/config.json: %w", files.Where(), err)
	}
	cfg, err := fit.ParseConfig(b)
	if err != nil {
		return fit.Model{}, fmt.Errorf("%s/config.json: %w", files.Where(), err)
	}
	names, err := safetensorsFiles(ctx, files)
	if err != nil {
		return fit.Model{}, err
	}
	var tensors []fit.Tensor
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return fit.Model{}, err
		}
		ts, err := ReadSafetensorsHeader(ctx, files, n)
		if isNotFound(err) && len(names) == 1 {
			return fit.Model{}, fmt.Errorf("%s: no model.safetensors and no model.safetensors.index.json: the weights are not safetensors", files.Where())
		}
		if err != nil {
			return fit.Model{}, err
		}
		tensors = append(tensors, ts...)
	}
	return fit.Model{Name: files.Where(), Format: "safetensors", Config: cfg, Tensors: tensors}, nil
}

// LoadPath reads a model from a local path: a .gguf file, a model
// directory, a hub cache model directory (models--ORG--NAME, whose newest
// snapshot, or the one refs/main names, is read) or a directory holding a
// single .gguf file.
func LoadPath(ctx context.Context, path string) (fit.Model, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fit.Model{}, fmt.Errorf("model %s: %w", path, err)
	}
	if !st.IsDir() {
		if !strings.HasSuffix(path, ".gguf") {
			return fit.Model{}, fmt.Errorf("model %s: a file that is not .gguf: want a model directory or a .gguf file", path)
		}
		d, err := OpenDir(filepath.Dir(path), "")
		if err != nil {
			return fit.Model{}, err
		}
		defer d.Close()
		m, err := ReadGGUF(ctx, d, filepath.Base(path))
		m.Name = path
		return m, err
	}
	sub, err := snapshot(path)
	if err != nil {
		return fit.Model{}, err
	}
	d, err := OpenDir(path, sub)
	if err != nil {
		return fit.Model{}, err
	}
	defer d.Close()
	gguf := ""
	if _, err := d.ReadRange(ctx, "config.json", 0, 1); isNotFound(err) {
		list, _ := d.List()
		var ggufs []string
		for _, n := range list {
			if strings.HasSuffix(n, ".gguf") {
				ggufs = append(ggufs, n)
			}
		}
		if len(ggufs) == 1 {
			gguf = ggufs[0]
		}
	}
	m, err := Load(ctx, d, gguf)
	if err == nil {
		m.Name = path
	}
	return m, err
}

// snapshot is the directory inside a hub cache model directory that holds
// its files ("" for a plain model directory): the one refs/main names,
// else the last by name.
func snapshot(dir string) (string, error) {
	entries, err := os.ReadDir(filepath.Join(dir, "snapshots"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("model %s: %w", dir, err)
	}
	var revs []string
	for _, e := range entries {
		if e.IsDir() {
			revs = append(revs, e.Name())
		}
	}
	if len(revs) == 0 {
		return "", fmt.Errorf("model %s: a hub cache directory with no snapshot", dir)
	}
	if ref, err := os.ReadFile(filepath.Join(dir, "refs", "main")); err == nil {
		if r := strings.TrimSpace(string(ref)); slices.Contains(revs, r) {
			return "snapshots/" + r, nil
		}
	}
	slices.Sort(revs)
	return "snapshots/" + revs[len(revs)-1], nil
}
