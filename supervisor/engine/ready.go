package engine

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/probes/load"
	"github.com/llmgw/llmgw/supervisor/profile"
)

// probeReady is the readiness rule: /health answers 200 and the models
// list names the served model. Both probes carry the engine's key: the
// models path is guarded by it (a wrong key, like another engine's on a
// reused port, is not ready), and the engines leave /health open, so the
// header costs nothing there.
func (r *Runner) probeReady(ctx context.Context, e *managed) bool {
	r.mu.Lock()
	port, served := e.state.Spec.HTTPPort, e.state.Spec.ServedModelName
	r.mu.Unlock()
	prof, err := r.profileOf(e)
	if err != nil || port == 0 {
		return false
	}
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	key := r.engineKey(e.id)
	ok := func(path string, body *[]byte) bool {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := r.cfg.HTTP.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		if body != nil {
			*body, _ = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		}
		return resp.StatusCode == http.StatusOK
	}
	if !ok(prof.HealthPath, nil) {
		return false
	}
	var body []byte
	if !ok(prof.ModelsPath, &body) {
		return false
	}
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &models) != nil {
		return false
	}
	for _, m := range models.Data {
		if m.ID == served || served == "" {
			return true
		}
	}
	return false
}

// ownsPort checks, when an engine is about to be believed ready, that the
// answer on its port comes from the engine's own process tree: another
// process there (a stale engine of another agent on this host) would make
// the lease, and the route, point at the wrong model. Once ready, the
// check is not repeated every poll (it scans /proc).
func (r *Runner) ownsPort(e *managed, pid int) bool {
	r.mu.Lock()
	was, port := e.ready, e.state.Spec.HTTPPort
	r.mu.Unlock()
	if was || pid <= 0 || port <= 0 {
		return true
	}
	_, found, err := r.cfg.ListenerOwner(port, pid)
	// An error means nothing to judge by: nothing listens in our network
	// namespace although the port answered (an engine in a namespace of
	// its own), or /proc is not readable.
	foreign := err == nil && !found
	r.mu.Lock()
	if foreign && !e.portForeign {
		r.log.Warn("engine port answered by a process that is not the engine; not ready", "shard", e.state.ShardID, "port", port, "engine_pid", pid)
	}
	e.portForeign = foreign
	r.mu.Unlock()
	return !foreign
}

// scrapeLoad reads the engine's /metrics every LoadInterval. Rates come
// from counter deltas; the tracker re-baselines when the engine restarted.
func (r *Runner) scrapeLoad(ctx context.Context, e *managed) {
	r.mu.Lock()
	due := r.cfg.Clock.Now().Sub(e.scrapedAt) >= r.cfg.LoadInterval
	port := e.state.Spec.HTTPPort
	r.mu.Unlock()
	if !due {
		return
	}
	prof, err := r.profileOf(e)
	if err != nil || prof.MetricsPath == "" {
		return
	}
	sample, err := r.scraperOf(e, prof).Scrape(ctx, "http://127.0.0.1:"+strconv.Itoa(port)+prof.MetricsPath)
	var l load.Load
	if err != nil {
		r.scrapeErrors.Add(1)
		l = r.tracker.Failed(e.id, r.cfg.Clock.Now(), err)
	} else {
		l = r.tracker.Observe(e.id, sample)
	}
	r.mu.Lock()
	e.scrapedAt = r.cfg.Clock.Now()
	e.load = gossip.ShardLoad{Running: l.Running, Waiting: l.Waiting, KVCacheUsage: l.KVCacheUsage, PromptTPS: l.PromptTPS,
		GenerationTPS: l.GenerationTPS, RatesValid: l.RatesValid, PrefixHitRate: l.PrefixHitRate, PrefixQueriesPS: l.PrefixQueriesPS,
		ScrapedAt: l.ScrapedAt, Error: l.Error}
	r.notifyLocked()
	r.mu.Unlock()
}

// scraperOf is e's /metrics scraper, made on first use with prof's metric
// names.
func (r *Runner) scraperOf(e *managed, prof profile.Profile) *load.Scraper {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.scraper == nil {
		// The key goes with every scrape: llama.cpp guards /metrics with
		// it, vLLM and SGLang leave /metrics open and ignore it.
		e.scraper = load.NewScraper(r.cfg.HTTP, r.cfg.Clock, load.WithNames(prof.Metrics.LoadNames()),
			load.WithBearer(r.engineKey(e.id)))
	}
	return e.scraper
}

// ScrapeErrors counts failed engine /metrics scrapes.
func (r *Runner) ScrapeErrors() uint64 { return r.scrapeErrors.Load() }
