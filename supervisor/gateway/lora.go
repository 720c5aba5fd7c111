package gateway

import (
	"encoding/json"
	"slices"
	"strconv"
	"sync"

	"github.com/llmgw/llmgw/probes/load"
	"github.com/llmgw/llmgw/supervisor/profile"
)

// LoRA adapters. A request whose model names an adapter of a deployment
// (Table.adapter; a deployment's own name always wins) goes to that
// deployment's replicas whose engines list the adapter (Route.Adapters,
// from the holder's record), preferring, as llm-d's lora-affinity scorer
// does (pkg/epp/framework/plugins/scheduling/scorer/loraaffinity), those
// where it is active in a GPU slot, then those with a free slot, then
// those where it waits for one, by this gateway's own scrape of vLLM's
// vllm:lora_requests_info (it changes with every batch and does not
// belong in gossip). Among the preferred the policy chooses as for any
// request, its load bound included; the prefix key includes the adapter,
// since an engine's cache blocks are per adapter. The engine is asked
// for the adapter as it names it: vLLM by the adapter's own name, SGLang
// as "<deployment>:<adapter>" (its TokenizerManager splits the model on
// the first ':' into base and adapter).

// Adapter affinity, best first.
const (
	loraActive  = 4 // running in a slot
	loraFree    = 3 // not in a slot, and a slot is free
	loraUnknown = 2 // no reading of the engine's slots yet
	loraWaiting = 1 // waiting there for a slot
	loraFull    = 0 // every slot busy with other adapters
)

// loraScore is how well an engine whose slots are as l says serves
// adapter a now.
func loraScore(l *load.LoRA, a string) int {
	switch {
	case l == nil:
		return loraUnknown
	case slices.Contains(l.Running, a):
		return loraActive
	case l.Max <= 0 || len(l.Running) < l.Max:
		return loraFree
	case slices.Contains(l.Waiting, a):
		return loraWaiting
	}
	return loraFull
}

// adapterRoutes is routes for the exchange's adapter: of the routes whose
// engine lists it, the best by loraScore among those below the
// deployment's bound (Entry.Bound, by this gateway's estimate), or among
// all of them when every one is at it (the queue then holds what they do
// not take); routes itself when the request names no adapter.
func (x *exchange) adapterRoutes(routes []*liveRoute, e *Entry) []*liveRoute {
	if x.role != "" {
		routes = byRole(routes, x.role)
	}
	if x.adapter == "" {
		return routes
	}
	now := x.g.clock.Now()
	type scored struct {
		lr    *liveRoute
		score int
		room  bool
	}
	var all []scored
	anyRoom := false
	for _, lr := range routes {
		if !slices.Contains(lr.Adapters, x.adapter) {
			continue
		}
		room := true
		if e.Bound > 0 {
			l, _ := lr.rep.load.estimate(now, x.g.cfg.ScrapeInterval, lr.Load)
			room = l < float64(e.Bound)
		}
		anyRoom = anyRoom || room
		all = append(all, scored{lr, loraScore(lr.rep.lora.Load(), x.adapter), room})
	}
	best, out := -1, make([]*liveRoute, 0, len(all))
	for _, s := range all {
		if anyRoom && !s.room {
			continue
		}
		switch {
		case s.score > best:
			best, out = s.score, append(out[:0], s.lr)
		case s.score == best:
			out = append(out, s.lr)
		}
	}
	return out
}

// adapterModel is the model engine kind lr is asked for to get adapter a
// of deployment e, as its profile says (profile.Profile.LoRARequest).
func (g *Gateway) adapterModel(e *Entry, a string) string {
	switch g.cfg.Profiles[e.Engine].LoRARequest {
	case profile.LoRABaseColon:
		return e.Name + ":" + a
	case profile.LoRAByIndex:
		return e.Name // and the adapter by its index: llamaCppAdapterBody
	}
	return a
}

// byIndex says whether engine kind takes adapters by index.
func (g *Gateway) byIndex(engine string) bool {
	return g.cfg.Profiles[engine].LoRARequest == profile.LoRAByIndex
}

// llamaCppAdapterBody is body with adapter a of route lr turned on for
// this request alone: llama.cpp loads a deployment's adapters at start in
// the spec's order (--lora, each at scale 0 with --lora-init-without-apply),
// numbers them from 0 in that order, and takes a request's adapters as
// "lora": [{"id", "scale"}] (parse_lora_request in tools/server: it
// clears every adapter's scale, then sets the listed ones); the route's
// record lists them in that order. nil when lr's engine does not have it.
func llamaCppAdapterBody(body []byte, lr *liveRoute, a string) []byte {
	i := slices.Index(lr.Adapters, a)
	if i < 0 {
		return nil
	}
	m, err := pdFields(body)
	if err != nil {
		return nil
	}
	m["lora"] = json.RawMessage(`[{"id":` + strconv.Itoa(i) + `,"scale":1.0}]`)
	out, err := json.Marshal(m)
	if err != nil {
		return nil
	}
	return out
}

// maxAdapterLabels bounds the adapter label values of the per-key
// metrics on one gateway: a cluster may serve hundreds of adapters, and
// every key times every adapter would be a series.
const maxAdapterLabels = 64

// labelSet hands out a metric label for adapter names: the name itself
// for the first maxAdapterLabels seen, "other" after; "" stays "" (the
// deployment itself).
type labelSet struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (s *labelSet) label(name string) string {
	if name == "" {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[name] {
		return name
	}
	if len(s.seen) >= maxAdapterLabels {
		return "other"
	}
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	s.seen[name] = true
	return name
}
