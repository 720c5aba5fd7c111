package containerd

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// normalizeRef turns "vllm/vllm-openai" into
// "docker.io/vllm/vllm-openai:latest": containerd stores full names only.
func normalizeRef(ref string) (string, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w", ref, err)
	}
	return named.String(), nil
}

// EnsureImage implements runtime.ImagePuller: it makes ref present and
// unpacked, pulling it when missing. Engine
// images are 12-28 GB, so a pull logs its progress every progress interval.
// Pulls use no registry credentials.
func (r *Runtime) EnsureImage(ctx context.Context, ref string, progress func(done, total int64)) error {
	name, err := normalizeRef(ref)
	if err != nil {
		return fmt.Errorf("containerd runtime: %w", err)
	}
	ctx = r.nsCtx(ctx)
	img, err := r.c.GetImage(ctx, name)
	switch {
	case err == nil:
		if ok, err := img.IsUnpacked(ctx, r.snapshotter); err == nil && ok {
			return nil
		}
		if err := img.Unpack(ctx, r.snapshotter); err != nil {
			return fmt.Errorf("containerd runtime: unpack %s: %w", name, err)
		}
		return nil
	case !errdefs.IsNotFound(err):
		return fmt.Errorf("containerd runtime: image %s: %w", name, err)
	}

	p := &pullProgress{}
	r.log.Info("pulling image", "ref", name)
	start := r.clk.Now()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.reportProgress(ctx, name, p, done, progress)
	}()
	_, err = r.c.Pull(ctx, name,
		client.WithPullUnpack,
		client.WithPullSnapshotter(r.snapshotter),
		client.WithImageHandlerWrapper(p.wrap),
	)
	close(done)
	wg.Wait()
	if err != nil {
		return fmt.Errorf("containerd runtime: pull %s: %w", name, err)
	}
	total, _, _, _ := p.snapshot()
	r.log.Info("pulled image", "ref", name, "size", humanBytes(total), "took", r.clk.Since(start).Round(time.Millisecond).String())
	return nil
}

// humanBytes is a size for people: "12.3 GiB".
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// pullProgress counts the blobs a pull dispatches and finishes. Bytes in
// flight come from the content store's ingest statuses.
type pullProgress struct {
	mu          sync.Mutex
	total       int64
	doneBytes   int64
	blobs, done int
}

func (p *pullProgress) wrap(h images.Handler) images.Handler {
	return images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		p.mu.Lock()
		p.total += desc.Size
		p.blobs++
		p.mu.Unlock()
		children, err := h.Handle(ctx, desc)
		if err == nil {
			p.mu.Lock()
			p.doneBytes += desc.Size
			p.done++
			p.mu.Unlock()
		}
		return children, err
	})
}

func (p *pullProgress) snapshot() (total, doneBytes int64, blobs, done int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total, p.doneBytes, p.blobs, p.done
}

func (r *Runtime) reportProgress(ctx context.Context, name string, p *pullProgress, done <-chan struct{}, progress func(done, total int64)) {
	if r.progressTick <= 0 {
		return
	}
	t := r.clk.NewTicker(r.progressTick)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		total, doneBytes, blobs, finished := p.snapshot()
		var inflight int64
		// Active ingests: the client writes to the daemon in 1 MiB pieces,
		// so a multi-gigabyte layer shows steady progress here.
		if sts, err := r.c.ContentStore().ListStatuses(ctx); err == nil {
			for _, s := range sts {
				inflight += s.Offset
			}
		}
		if progress != nil {
			progress(doneBytes+inflight, total)
		}
		r.log.Info("pulling image", "ref", name,
			"have", humanBytes(doneBytes+inflight),
			"of_known", humanBytes(total),
			"blobs", fmt.Sprintf("%d/%d", finished, blobs))
	}
}

// ImportImage reads a `docker save` or OCI archive, stores its images and
// unpacks them for the runtime's snapshotter. It returns the image names
// (docker archives are named from RepoTags, normalised: "llmgw/x:1" becomes
// "docker.io/llmgw/x:1").
func (r *Runtime) ImportImage(ctx context.Context, in io.Reader) ([]string, error) {
	ctx = r.nsCtx(ctx)
	imgs, err := r.c.Import(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: import: %w", err)
	}
	names := make([]string, 0, len(imgs))
	for _, i := range imgs {
		if err := client.NewImage(r.c, i).Unpack(ctx, r.snapshotter); err != nil {
			return names, fmt.Errorf("containerd runtime: unpack %s: %w", i.Name, err)
		}
		names = append(names, i.Name)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("containerd runtime: import: the archive names no image (docker archives need RepoTags, OCI archives an io.containerd.image.name or org.opencontainers.image.ref.name annotation)")
	}
	return names, nil
}
