package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement/fit"
	"github.com/llmgw/llmgw/probes/weights"
)

// The weights probe: what --weights-dir holds goes into the node's record
// (placement prefers nodes that have a deployment's model), rescanned on a
// slow tick and whenever a gpu_memory: auto place looks for a model here.
// It reads directory entries and sizes only.

// defaultWeightsInterval is the slow tick: a download lands in minutes.
const defaultWeightsInterval = time.Minute

// maxHeadersBody bounds a peer's answer with a model's headers: the tensor
// list of the largest checkpoints is a few MiB of JSON.
const maxHeadersBody = 64 << 20

// scanWeights lists the weights dir for the record; an unreadable dir is
// logged and reported as holding nothing.
func (n *Node) scanWeights() []gossip.CachedModel {
	if n.cfg.WeightsDir == "" {
		return nil
	}
	found, err := weights.Scan(n.cfg.WeightsDir)
	if err != nil {
		n.log.Warn("weights scan failed; reporting no cached models", "err", err)
		return nil
	}
	out := make([]gossip.CachedModel, 0, len(found))
	for _, c := range found {
		out = append(out, gossip.CachedModel{Model: c.Model, Bytes: c.Bytes})
	}
	return out
}

// RescanWeights asks the weights loop to scan now.
func (n *Node) RescanWeights() {
	select {
	case n.rescan <- struct{}{}:
	default:
	}
}

func (n *Node) weightsLoop(ctx context.Context) {
	defer n.wg.Done()
	every := n.cfg.WeightsInterval
	if every <= 0 {
		every = defaultWeightsInterval
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-n.rescan:
		}
		cur := n.scanWeights()
		if !slices.Equal(cur, n.cluster.Local().CachedModels) {
			n.cluster.UpdateLocal(func(r *gossip.NodeRecord) { r.CachedModels = cur })
		}
	}
}

// handleWeightsHeaders answers another node's gpu_memory: auto lookup with
// the headers of a model in this node's weights dir: config and tensor
// list, never the weights. It needs the token or a hop signed for
// "weights".
func (n *Node) handleWeightsHeaders(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(hopHeader) != "" {
		if _, err := n.verifyHop(r, "weights", nil); err != nil {
			writeError(w, http.StatusForbidden, err.Error())
			return
		}
	} else if !n.checkToken(w, r) {
		return
	}
	model := r.URL.Query().Get("model")
	path, ok := weights.Find(n.cfg.WeightsDir, model)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("%s: model %q is not in this node's weights dir", n.cfg.Name, model))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	m, err := weights.LoadPath(ctx, path)
	if err != nil {
		writeError(w, http.StatusUnprocessableEntity, fmt.Sprintf("%s: %v", n.cfg.Name, err))
		return
	}
	m.Name = model
	writeJSON(w, http.StatusOK, m)
}

// peerHeaders asks a node that reports model cached for its headers,
// signing the hop.
func (n *Node) peerHeaders(ctx context.Context, api, model string) (fit.Model, error) {
	u := "http://" + api + "/v1/weights/headers?model=" + url.QueryEscape(model)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fit.Model{}, err
	}
	n.signHop(req, "weights", "place", nil)
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
