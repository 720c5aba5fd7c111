package ctrtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Registry serves one image over the OCI distribution API (the read half:
// manifests and blobs, no auth), enough for containerd's client to pull it.
// Clients pull over plain HTTP from loopback hosts by default.
type Registry struct {
	repo, tag string
	manifest  []byte
	blobs     map[string][]byte // by digest
	// ChunkDelay, when set, pauses after every 32 KiB of a blob, so a pull
	// lasts long enough to report progress.
	ChunkDelay time.Duration
}

// NewRegistry builds the OCI manifest, config and single layer of img and
// serves them as repo:tag.
func NewRegistry(repo, tag string, img Image) (*Registry, error) {
	layer, err := layerTar(img.Files)
	if err != nil {
		return nil, err
	}
	layerDigest := digest(layer)
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
		"config":       map[string]any{"Entrypoint": img.Entrypoint, "Cmd": img.Cmd, "Env": env},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	if err != nil {
		return nil, err
	}
	cfgDigest := digest(cfg)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfgDigest, "size": len(cfg)},
		"layers": []map[string]any{{
			"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": len(layer),
		}},
	})
	if err != nil {
		return nil, err
	}
	return &Registry{
		repo: repo, tag: tag, manifest: manifest,
		blobs: map[string][]byte{cfgDigest: cfg, layerDigest: layer},
	}, nil
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// Size is the number of bytes a pull transfers (manifest and blobs).
func (g *Registry) Size() int {
	n := len(g.manifest)
	for _, b := range g.blobs {
		n += len(b)
	}
	return n
}

func (g *Registry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "read-only registry", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Docker-Distribution-Api-Version", "registry/2.0")
	if r.URL.Path == "/v2/" || r.URL.Path == "/v2" {
		w.WriteHeader(http.StatusOK)
		return
	}
	prefix := "/v2/" + g.repo + "/"
	rest, ok := strings.CutPrefix(r.URL.Path, prefix)
	if !ok {
		http.NotFound(w, r)
		return
	}
	md := digest(g.manifest)
	switch {
	case rest == "manifests/"+g.tag || rest == "manifests/"+md:
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		w.Header().Set("Docker-Content-Digest", md)
		g.write(w, r, g.manifest)
	case strings.HasPrefix(rest, "blobs/"):
		b, ok := g.blobs[strings.TrimPrefix(rest, "blobs/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Docker-Content-Digest", strings.TrimPrefix(rest, "blobs/"))
		g.write(w, r, b)
	default:
		http.NotFound(w, r)
	}
}

func (g *Registry) write(w http.ResponseWriter, r *http.Request, b []byte) {
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	if r.Method == http.MethodHead {
		w.WriteHeader(http.StatusOK)
		return
	}
	if g.ChunkDelay <= 0 {
		_, _ = w.Write(b)
		return
	}
	rd := bytes.NewReader(b)
	buf := make([]byte, 32<<10)
	for {
		n, err := rd.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
			select {
			case <-time.After(g.ChunkDelay):
			case <-r.Context().Done():
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Ref is the reference of the served image on host (host:port).
func (g *Registry) Ref(host string) string { return fmt.Sprintf("%s/%s:%s", host, g.repo, g.tag) }
