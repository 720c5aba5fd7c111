package gateway

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/llmgw/llmgw/probes/load"
)

// scrapeTimeout bounds one scrape: a load reading that takes longer is too
// old to choose by when it arrives.
const scrapeTimeout = 2 * time.Second

// scrapers reads engines' /metrics for the gateway's own load estimate. A
// scrape starts from a request's choice, never from a ticker, so only
// deployments that see traffic are scraped, each engine at most once per
// interval (a tenth of its requests' duration, between ScrapeInterval and
// a second; see replica.interval) and never twice at once. The engine
// runner's own scrape (every 5 s, gossiped) is the fallback.
type scrapers struct {
	g      *Gateway
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	closed   bool
	wg       sync.WaitGroup
	byEngine map[string]*engineScraper
}

// engineScraper reads one engine kind's page; nil for kinds without one.
type engineScraper struct {
	s    *load.Scraper
	path string
}

func newScrapers(g *Gateway) *scrapers {
	ctx, cancel := context.WithCancel(context.Background())
	return &scrapers{g: g, ctx: ctx, cancel: cancel, byEngine: map[string]*engineScraper{}}
}

// forEngine returns the scraper of an engine kind, made on first use.
func (s *scrapers) forEngine(engine string) *engineScraper {
	s.mu.Lock()
	defer s.mu.Unlock()
	if es, ok := s.byEngine[engine]; ok {
		return es
	}
	var es *engineScraper
	if p, ok := s.g.cfg.Profiles[engine]; ok && p.MetricsPath != "" && (p.Metrics.Running != "" || p.Metrics.Waiting != "") {
		client := &http.Client{Transport: s.g.tr, Timeout: scrapeTimeout}
		es = &engineScraper{path: p.MetricsPath,
			s: load.NewScraper(client, s.g.clock, load.WithNames(p.Metrics.LoadNames()))}
	}
	s.byEngine[engine] = es
	return es
}

// maybe starts a scrape of lr's engine if one is due.
func (s *scrapers) maybe(engine string, lr *liveRoute, now time.Time) {
	es := s.forEngine(engine)
	if es == nil {
		return
	}
	epoch, due := lr.rep.load.scrapeDue(now, s.g.cfg.ScrapeInterval)
	if !due {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		lr.rep.load.scrapeDone(epoch, 0, time.Time{}, false)
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	url, rep, dep := lr.base()+es.path, lr.rep, lr.Deployment
	// The engine's own key: llama.cpp guards /metrics with it (vLLM and
	// SGLang leave it open and ignore the header). Through a relay, the
	// holder presents it, and this gateway signs the scrape instead.
	key := ""
	if s.g.cfg.EngineKey != nil {
		key = s.g.cfg.EngineKey(lr.EngineID)
	}
	prepare := func(req *http.Request) {
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
	}
	if lr.Relay != "" {
		url = lr.Relay + es.path
		relay := s.g.cfg.Relay
		prepare = func(req *http.Request) {
			if relay != nil {
				relay.Sign(req, "scrape", nil)
			}
		}
	}
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(s.ctx, scrapeTimeout)
		defer cancel()
		sm, err := es.s.ScrapeWith(ctx, url, prepare)
		if err != nil {
			s.g.m.scrapeErrors.Inc()
			rep.load.scrapeDone(epoch, 0, time.Time{}, false)
			return
		}
		rep.load.scrapeDone(epoch, sm.Running+sm.Waiting, sm.At, true)
		rep.lora.Store(sm.LoRA)
		// A reading lower than the estimate was makes room.
		s.g.kick(dep)
	}()
}

// close cancels scrapes in progress and waits for them.
func (s *scrapers) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}
