package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/placement/fit"
	"github.com/llmgw/llmgw/probes/weights"
	"github.com/llmgw/llmgw/supervisor/publish"
)

// The weights probe: what --weights-dir holds goes into the node's record
// (placement prefers nodes that have a deployment's model), rescanned on a
// slow tick and whenever a gpu_memory: auto place looks for a model here.
// It reads directory entries and sizes only. Its HTTP side, a peer asking
// for a model's headers, is endpoint_weights.go.

// defaultWeightsInterval is the slow tick: a download lands in minutes.
const defaultWeightsInterval = time.Minute

// maxHeadersBody bounds a peer's answer with a model's headers: the tensor
// list of the largest checkpoints is a few MiB of JSON.
const maxHeadersBody = 64 << 20

// weightsLoop scans the weights dir (Config.WeightsDir; empty: none) into
// the record every tick (Config.WeightsInterval) and when asked to.
type weightsLoop struct {
	dir   string
	every time.Duration
	clock clock.Clock
	log   *slog.Logger
	// rescan makes the loop scan now.
	rescan chan struct{}
}

// scan lists the weights dir for the record; an unreadable dir is logged
// and reported as holding nothing.
func (w *weightsLoop) scan() []gossip.CachedModel {
	if w.dir == "" {
		return nil
	}
	found, err := weights.Scan(w.dir)
	if err != nil {
		w.log.Warn("weights scan failed; reporting no cached models", "err", err)
		return nil
	}
	out := make([]gossip.CachedModel, 0, len(found))
	for _, c := range found {
		out = append(out, gossip.CachedModel{Model: c.Model, Bytes: c.Bytes})
	}
	return out
}

// run scans every tick, or when asked, until ctx ends, publishing into
// rec what changed.
func (w *weightsLoop) run(ctx context.Context, rec publish.Record) {
	every := w.every
	if every <= 0 {
		every = defaultWeightsInterval
	}
	tick := w.clock.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.Chan():
		case <-w.rescan:
		}
		cur := w.scan()
		if !slices.Equal(cur, rec.Local().CachedModels) {
			rec.UpdateLocal(func(r *gossip.NodeRecord) { r.CachedModels = cur })
		}
	}
}

// RescanWeights asks the weights loop to scan now.
func (n *Node) RescanWeights() {
	select {
	case n.weights.rescan <- struct{}{}:
	default:
	}
}

// peerHeaders asks a node that reports model cached for its headers,
// signing the hop.
func (n *Node) peerHeaders(ctx context.Context, api, model string) (fit.Model, error) {
	u := "http://" + api + "/v1/weights/headers?model=" + url.QueryEscape(model)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fit.Model{}, err
	}
	n.hops.sign(req, "weights", "place", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fit.Model{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxHeadersBody+1))
	if err != nil {
		return fit.Model{}, err
	}
	if len(body) > maxHeadersBody {
		return fit.Model{}, fmt.Errorf("headers over %d MiB", maxHeadersBody>>20)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		_ = json.Unmarshal(body, &e)
		return fit.Model{}, fmt.Errorf("%s: %s", resp.Status, e.Error)
	}
	var m fit.Model
	if err := json.Unmarshal(body, &m); err != nil {
		return fit.Model{}, fmt.Errorf("headers: %w", err)
	}
	return m, nil
}
