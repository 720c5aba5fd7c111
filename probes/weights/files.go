// Package weights reads what a node knows about model weights without
// reading the weights: config.json, the safetensors headers (each file's
// 8-byte length and JSON header, never the tensors) and GGUF headers, from
// a local directory, the Hugging Face hub cache layout, or the hub itself
// by HTTP range requests; and it lists the models a weights directory
// holds, with their size on disk. The arithmetic on what it reads is
// placement/fit's.
package weights

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Limits on what a header may cost. A safetensors header of a trillion-
// parameter checkpoint is a few MiB; anything near these is not a header.
const (
	// MaxHeader bounds one safetensors JSON header or one GGUF header.
	MaxHeader = 100 << 20
	// maxConfig bounds config.json and the safetensors index.
	maxConfig = 16 << 20
	// maxShards bounds the files one index may name.
	maxShards = 4096
)

// ErrNotFound is returned by Files when a file does not exist.
var ErrNotFound = errors.New("not found")

// Files reads one model's files, wherever they are.
type Files interface {
	// ReadFile returns a whole small file, at most limit bytes; a longer
	// file is an error.
	ReadFile(ctx context.Context, name string, limit int64) ([]byte, error)
	// ReadRange returns n bytes from off; fewer only at the end of the
	// file.
	ReadRange(ctx context.Context, name string, off, n int64) ([]byte, error)
	// Where names the files for errors: a directory or a URL.
	Where() string
}

// Dir reads a model directory through os.Root, so names from an index
// cannot leave it (a hub cache snapshot's symbolic links into its blobs
// stay inside the model's own directory, which is the root).
type Dir struct {
	root *os.Root
	sub  string // the snapshot within the root, or "."
	path string
}

// OpenDir opens path as a model directory. sub, if not empty, is the
// directory inside it that holds the files (a hub cache snapshot).
func OpenDir(path, sub string) (*Dir, error) {
	r, err := os.OpenRoot(path)
	if err != nil {
		return nil, fmt.Errorf("weights directory %s: %w", path, err)
	}
	if sub == "" {
		sub = "."
	}
	return &Dir{root: r, sub: sub, path: path}, nil
}

// Close releases the directory.
func (d *Dir) Close() error { return d.root.Close() }

// Where is the directory's path.
func (d *Dir) Where() string {
	if d.sub == "." {
		return d.path
	}
	return d.path + "/" + d.sub
}

func (d *Dir) open(name string) (*os.File, error) {
	f, err := d.root.Open(d.sub + "/" + name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	return f, err
}

// ReadFile reads a small file whole.
func (d *Dir) ReadFile(_ context.Context, name string, limit int64) ([]byte, error) {
	f, err := d.open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is over %d bytes", name, limit)
	}
	return b, nil
}

// ReadRange reads n bytes at off.
func (d *Dir) ReadRange(_ context.Context, name string, off, n int64) ([]byte, error) {
	f, err := d.open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	got, err := f.ReadAt(b, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b[:got], nil
}

// List names the directory's regular files and links (not recursing).
func (d *Dir) List() ([]string, error) {
	entries, err := fs.ReadDir(d.root.FS(), d.sub)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
