package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/probes/load"
	"github.com/llmgw/llmgw/supervisor/profile"
)

// probeReady runs one readiness probe: /health answers 200 and the models
// list names the served model, each within the profile's probe timeout.
// Both probes carry the engine's key: the models path is guarded by it (a
// wrong key, like another engine's on a reused port, is not ready), and
// the engines leave /health open, so the header costs nothing there. It
// says how a failed probe failed.
func (r *Runner) probeReady(ctx context.Context, e *managed) (bool, string) {
	r.mu.Lock()
	port, served := e.state.Spec.HTTPPort, e.state.Spec.ServedModelName
	r.mu.Unlock()
	prof, err := r.profileOf(e)
	if err != nil {
		return false, err.Error()
	}
	if port == 0 {
		return false, "no port"
	}
	timeout := r.ruleOf(prof).ProbeTimeout
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	key := r.engineKey(e.id)
	get := func(path string, body *[]byte) string {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(pctx, "GET", base+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := r.cfg.HTTP.Do(req)
		if err != nil {
			if pctx.Err() != nil && ctx.Err() == nil {
				return fmt.Sprintf("%s timed out after %s", path, timeout)
			}
			return fmt.Sprintf("%s: %v", path, errors.Unwrap(err))
		}
		defer resp.Body.Close()
		if body != nil {
			*body, _ = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Sprintf("%s answered %d", path, resp.StatusCode)
		}
		return ""
	}
	if why := get(prof.HealthPath, nil); why != "" {
		return false, why
	}
	var body []byte
	if why := get(prof.ModelsPath, &body); why != "" {
		return false, why
	}
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &models) != nil {
		return false, prof.ModelsPath + " is not a models list"
	}
	for _, m := range models.Data {
		if m.ID == served || served == "" {
			return true, ""
		}
	}
	return false, fmt.Sprintf("%s does not list %q", prof.ModelsPath, served)
}

// ruleOf is prof's readiness rule with the node's overrides applied.
func (r *Runner) ruleOf(prof profile.Profile) profile.Readiness {
	rule := prof.Readiness
	o := r.cfg.Readiness
	if o.ProbeTimeout > 0 {
		rule.ProbeTimeout = o.ProbeTimeout
	}
	if o.Failures > 0 {
		rule.Failures = o.Failures
	}
	if o.ProgressWindow > 0 {
		rule.ProgressWindow = o.ProgressWindow
	}
	if o.HungRestart > 0 {
		rule.HungRestart = o.HungRestart
	}
	// A profile loaded without a rule still gets a bounded probe.
	if rule.ProbeTimeout <= 0 {
		rule.ProbeTimeout = 2 * time.Second
	}
	if rule.Failures <= 0 {
		rule.Failures = 1
	}
	return rule
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

// scrapeLoad reads the engine's /metrics every LoadInterval, or at once
// when force (the readiness rule needs to know whether its counters move).
// Rates come from counter deltas; the tracker re-baselines when the engine
// restarted. It returns the token counters (prompt plus generation) when
// it read them.
func (r *Runner) scrapeLoad(ctx context.Context, e *managed, force bool, timeout time.Duration) (counters float64, ok bool) {
	r.mu.Lock()
	due := force || r.cfg.Clock.Now().Sub(e.scrapedAt) >= r.cfg.LoadInterval
	port := e.state.Spec.HTTPPort
	r.mu.Unlock()
	if !due {
		return 0, false
	}
	prof, err := r.profileOf(e)
	if err != nil || prof.MetricsPath == "" {
		return 0, false
	}
	if timeout <= 0 {
		timeout = r.ruleOf(prof).ProbeTimeout
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sample, err := r.scraperOf(e, prof).Scrape(sctx, "http://127.0.0.1:"+strconv.Itoa(port)+prof.MetricsPath)
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
	if err != nil {
		return 0, false
	}
	// The engine's start time takes part: a restarted engine's counters
	// start over, and that is a change too.
	return sample.PromptTokens + sample.GenerationTokens + sample.StartTime, true
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

// Unroutable counts ready engines that left routing by the readiness rule
// (judge.go): probes failing and counters frozen.
func (r *Runner) Unroutable() uint64 { return r.unroutable.Load() }

// HungRestarts counts engines restarted because they stayed unroutable
// without progress for their profile's HungRestart.
func (r *Runner) HungRestarts() uint64 { return r.hungRestarts.Load() }

// scrapeDue reports whether e's load is due to be read (every LoadInterval).
func (r *Runner) scrapeDue(e *managed) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg.Clock.Now().Sub(e.scrapedAt) >= r.cfg.LoadInterval
}
