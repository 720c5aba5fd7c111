// Package ctrtest builds container images for tests without docker: a
// docker-archive tar (what `docker save` writes and containerd imports) with
// one uncompressed layer holding a few files, usually one static Go binary.
//
// It also builds that binary (CGO_ENABLED=0, so it runs in an image with no
// libc). It imports no containerd package.
package ctrtest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// File is one file of the layer.
type File struct {
	// Path inside the image, absolute or relative to /.
	Path string
	Mode int64
	Data []byte
}

// Image describes a single-layer image.
type Image struct {
	// RepoTag names the image on import, e.g. "llmgw/fake:test" (containerd
	// stores it as docker.io/llmgw/fake:test).
	RepoTag    string
	Entrypoint []string
	Cmd        []string
	Env        []string
	Files      []File
	// Arch defaults to amd64: an image must name its platform or
	// containerd's import filter drops it.
	Arch string
}

// epoch is every file's mtime, so equal inputs give byte-equal archives.
var epoch = time.Unix(0, 0).UTC()

// WriteDockerArchive writes img as a docker-archive tar: manifest.json, the
// config blob and <layer digest>/layer.tar.
func WriteDockerArchive(w io.Writer, img Image) error {
	if img.RepoTag == "" {
		return fmt.Errorf("ctrtest: image needs a RepoTag to be named on import")
	}
	layer, err := layerTar(img.Files)
	if err != nil {
		return err
	}
	layerSum := sha256.Sum256(layer)
	layerHex := hex.EncodeToString(layerSum[:])
	arch := img.Arch
	if arch == "" {
		arch = "amd64"
	}
	env := img.Env
	if env == nil {
		env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/"}
	}
	cfg, err := json.Marshal(map[string]any{
		"architecture": arch,
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config": map[string]any{
			"Entrypoint": img.Entrypoint,
			"Cmd":        img.Cmd,
			"Env":        env,
		},
		"rootfs": map[string]any{
			"type":     "layers",
			"diff_ids": []string{"sha256:" + layerHex},
		},
	})
	if err != nil {
		return err
	}
	cfgSum := sha256.Sum256(cfg)
	cfgName := hex.EncodeToString(cfgSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   cfgName,
		"RepoTags": []string{img.RepoTag},
		"Layers":   []string{layerHex + "/layer.tar"},
	}})
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	for _, f := range []struct {
		name string
		data []byte
	}{
		{cfgName, cfg},
		{layerHex + "/layer.tar", layer},
		{"manifest.json", manifest},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// layerTar builds the layer: every file plus its parent directories, and
// the directories a container expects to mount over (/etc, /tmp, /proc,
// /sys, /dev), sorted.
func layerTar(files []File) ([]byte, error) {
	dirs := map[string]bool{"etc": true, "tmp": true, "proc": true, "sys": true, "dev": true}
	byPath := map[string]File{}
	for _, f := range files {
		p := strings.TrimPrefix(path.Clean("/"+f.Path), "/")
		if p == "" {
			return nil, fmt.Errorf("ctrtest: file path %q", f.Path)
		}
		byPath[p] = f
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var names []string
	for d := range dirs {
		names = append(names, d+"/")
	}
	for p := range byPath {
		names = append(names, p)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		if strings.HasSuffix(n, "/") {
			mode := int64(0o755)
			if n == "tmp/" {
				mode = 0o1777
			}
			if err := tw.WriteHeader(&tar.Header{Name: n, Mode: mode, ModTime: epoch, Typeflag: tar.TypeDir}); err != nil {
				return nil, err
			}
			continue
		}
		f := byPath[n]
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: mode, Size: int64(len(f.Data)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// BuildStatic builds Go package pkg (an import path or a directory) with
// CGO_ENABLED=0 into out, from module directory dir. The environment is the
// caller's, so GOFLAGS and the module cache apply.
func BuildStatic(ctx context.Context, dir, pkg, out string) error {
	gobin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(gobin); os.Getenv("GOROOT") == "" || err != nil {
		if gobin, err = exec.LookPath("go"); err != nil {
			return fmt.Errorf("ctrtest: no go command: %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, gobin, "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ctrtest: go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}
