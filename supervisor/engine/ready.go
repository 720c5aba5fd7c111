package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/probes/load"
	"github.com/llmgw/llmgw/supervisor/profile"
)

// prober asks the engines over HTTP how they are: readiness probes (/health
// and the models list), whether the answer on a port comes from the
// engine's own process, and the /metrics load scrape with the tracker that
// turns its counters into rates. It counts what went wrong for our own
// metrics.
//
// Its methods take the engine's lock (managed.mu) themselves, and never
// hold it across a request.
type prober struct {
	http  *http.Client
	clock clock.Clock
	log   *slog.Logger
	// override is the node's readiness settings (Config.Readiness), over
	// each profile's rule.
	override profile.Readiness
	// listenerOwner is Config.ListenerOwner; loadInterval
	// Config.LoadInterval.
	listenerOwner func(port, pid int) (owner int, found bool, err error)
	loadInterval  time.Duration
	// key is each engine's API key, by engine ID (Config.engineKey).
	key     func(id string) string
	tracker *load.Tracker

	// scrapeErrors counts failed /metrics scrapes; unroutable and
	// hungRestarts count ready engines that left routing and hung engines
	// restarted (see judge.go, checkServing).
	scrapeErrors, unroutable, hungRestarts atomic.Uint64
	// missing counts the metrics engines did not export (missing.go).
	missing missingMetrics
}

func newProber(cfg Config, log *slog.Logger) *prober {
	return &prober{http: cfg.HTTP, clock: cfg.Clock, log: log, override: cfg.Readiness, listenerOwner: cfg.ListenerOwner,
		loadInterval: cfg.LoadInterval, key: cfg.engineKey, tracker: load.NewTracker()}
}

// ready runs one readiness probe of e: /health answers 200 and the models
// list names the served model, each within the profile's probe timeout.
// Both probes carry the engine's key: the models path is guarded by it (a
// wrong key, like another engine's on a reused port, is not ready), and
// the engines leave /health open, so the header costs nothing there. It
// says how a failed probe failed.
func (p *prober) ready(ctx context.Context, e *managed) (bool, string) {
	e.mu.Lock()
	port, served := e.state.Spec.HTTPPort, e.state.Spec.ServedModelName
	e.mu.Unlock()
	prof, err := e.profile()
	if err != nil {
		return false, err.Error()
	}
	if port == 0 {
		return false, "no port"
	}
	timeout := p.ruleOf(prof).ProbeTimeout
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	key := p.key(e.id)
	get := func(path string, body *[]byte) string {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(pctx, "GET", base+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := p.http.Do(req)
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
			e.setRegistered(registeredAdapters(body, served))
			return true, ""
		}
	}
	return false, fmt.Sprintf("%s does not list %q", prof.ModelsPath, served)
}

// ruleOf is prof's readiness rule with the node's overrides applied.
func (p *prober) ruleOf(prof profile.Profile) profile.Readiness {
	rule := prof.Readiness
	o := p.override
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

// ownsPort checks, when engine e is about to be believed ready, that the
// answer on its port comes from the engine's own process tree (pid and its
// descendants): another process there (a stale engine of another agent on
// this host) would make the lease, and the route, point at the wrong
// model. Once ready, the check is not repeated every poll (it scans
// /proc).
func (p *prober) ownsPort(e *managed, pid int) bool {
	e.mu.Lock()
	was, port := e.ready, e.state.Spec.HTTPPort
	e.mu.Unlock()
	if was || pid <= 0 || port <= 0 {
		return true
	}
	_, found, err := p.listenerOwner(port, pid)
	// An error means nothing to judge by: nothing listens in our network
	// namespace although the port answered (an engine in a namespace of
	// its own), or /proc is not readable.
	foreign := err == nil && !found
	e.mu.Lock()
	if foreign && !e.portForeign {
		p.log.Warn("engine port answered by a process that is not the engine; not ready", "shard", e.state.ShardID, "port", port, "engine_pid", pid)
	}
	e.portForeign = foreign
	e.mu.Unlock()
	return !foreign
}

// scrapeLoad reads e's /metrics now (its callers read it every
// LoadInterval, see scrapeDue, and at once when the readiness rule needs
// to know whether its counters move), bounded by timeout (0: the
// profile's probe timeout). Rates come from counter deltas; the tracker
// re-baselines when the engine restarted. It returns the token counters
// (prompt plus generation) when it read them.
func (p *prober) scrapeLoad(ctx context.Context, e *managed, timeout time.Duration) (counters float64, ok bool) {
	e.mu.Lock()
	port := e.state.Spec.HTTPPort
	e.mu.Unlock()
	prof, err := e.profile()
	if err != nil || prof.MetricsPath == "" {
		return 0, false
	}
	if timeout <= 0 {
		timeout = p.ruleOf(prof).ProbeTimeout
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sample, err := p.scraperOf(e, prof).Scrape(sctx, "http://127.0.0.1:"+strconv.Itoa(port)+prof.MetricsPath)
	var l load.Load
	if err != nil {
		p.scrapeErrors.Add(1)
		l = p.tracker.Failed(e.id, p.clock.Now(), err)
	} else {
		l = p.tracker.Observe(e.id, sample)
		if fresh := e.sawMissing(sample.Missing, p.clock.Now()); len(fresh) > 0 {
			p.missing.add(fresh)
			p.log.Warn("engine does not export metrics its profile reads; their readings are unknown", "engine", e.id,
				"engine_kind", prof.Name, "metrics", fresh)
		}
	}
	e.mu.Lock()
	e.scrapedAt = p.clock.Now()
	e.load = gossip.ShardLoad{Running: l.Running, Waiting: l.Waiting, KVCacheUsage: l.KVCacheUsage, PromptTPS: l.PromptTPS,
		GenerationTPS: l.GenerationTPS, RatesValid: l.RatesValid, PrefixHitRate: l.PrefixHitRate, PrefixQueriesPS: l.PrefixQueriesPS,
		ScrapedAt: l.ScrapedAt, Error: l.Error, Unknown: l.Unknown}
	notify(e.changes)
	e.mu.Unlock()
	if err != nil {
		return 0, false
	}
	// The engine's start time takes part: a restarted engine's counters
	// start over, and that is a change too.
	return sample.PromptTokens + sample.GenerationTokens + sample.StartTime, true
}

// scraperOf is e's /metrics scraper, made on first use with prof's metric
// names.
func (p *prober) scraperOf(e *managed, prof profile.Profile) *load.Scraper {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.scraper == nil {
		// The key goes with every scrape: llama.cpp guards /metrics with
		// it, vLLM and SGLang leave /metrics open and ignore it.
		e.scraper = load.NewScraper(p.http, p.clock, load.WithNames(prof.Metrics.LoadNames()),
			load.WithBearer(p.key(e.id)))
	}
	return e.scraper
}

// scrapeDue reports whether e's load is due to be read (every
// LoadInterval).
func (p *prober) scrapeDue(e *managed) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return p.clock.Now().Sub(e.scrapedAt) >= p.loadInterval
}

// forget drops what the tracker keeps of engine id, stopped for good.
func (p *prober) forget(id string) { p.tracker.Forget(id) }
