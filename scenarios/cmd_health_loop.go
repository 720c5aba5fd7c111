package scenarios

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
)

// healthLoop watches, from outside the cluster, whether a deployment is
// served at all: every poll it asks /health of every engine process that
// serves the deployment on this machine, found in /proc whatever any node
// says about it. A poll in which none answers 200 is a gap: the time a
// client would have found no engine, however good its routing.
type healthLoop struct {
	name, deployment string
	// timeout bounds each /health (250 ms unless timeout= says).
	timeout        time.Duration
	stopping, done chan struct{}
	once           sync.Once

	mu          sync.Mutex
	polls, gaps int
	// gapStart is when the current gap began (zero: none); longest is the
	// longest gap that ended, or the current one at stop.
	gapStart time.Time
	longest  time.Duration
	noteDone bool
	// answers are how long each 200 took, and failed how many asks did
	// not get one (an error, a timeout), for the summary.
	answers []time.Duration
	failed  int
}

// healthPollEvery spaces the polls: a gap shorter than it may go unseen.
const healthPollEvery = 25 * time.Millisecond

func (r *runner) cmdHealthLoop(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	name, err := d.nextPos("loop name")
	if err != nil {
		return "", time.Time{}, err
	}
	action, err := d.nextPos("start, stop or expect-no-gap")
	if err != nil {
		return "", time.Time{}, err
	}
	if action == "start" {
		dep, err := d.need("deployment")
		if err != nil {
			return "", time.Time{}, err
		}
		if _, ok := r.healthLoops[name]; ok {
			return "", time.Time{}, usagef("health-loop %s: started already", name)
		}
		timeout, err := d.duration("timeout", 250*time.Millisecond)
		if err != nil {
			return "", time.Time{}, err
		}
		l := &healthLoop{name: name, deployment: dep, timeout: timeout, stopping: make(chan struct{}), done: make(chan struct{})}
		r.healthLoops[name] = l
		go r.runHealthLoop(l)
		return "started: /health of every engine of " + dep + " in a loop", time.Now(), nil
	}
	l, ok := r.healthLoops[name]
	if !ok {
		return "", time.Time{}, usagef("health-loop %s: not started", name)
	}
	switch action {
	case "stop":
		l.stop()
		r.addHealthNote(l)
		return "stopped", time.Now(), nil
	case "expect-no-gap":
		l.mu.Lock()
		defer l.mu.Unlock()
		switch {
		case l.polls == 0:
			return "no poll yet", time.Time{}, nil
		case l.gaps > 0:
			return fmt.Sprintf("%d of %d polls found no engine of %s answering; longest gap %v", l.gaps, l.polls, l.deployment, l.longest.Round(time.Millisecond)), time.Time{}, nil
		}
		return "no gap: an engine of " + l.deployment + " answered at every poll", time.Time{}, nil
	}
	return "", time.Time{}, usagef("health-loop: want start, stop or expect-no-gap, got %q", action)
}

func (l *healthLoop) stop() {
	l.once.Do(func() { close(l.stopping) })
	<-l.done
}

func (r *runner) addHealthNote(l *healthLoop) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.noteDone {
		return
	}
	l.noteDone = true
	note := fmt.Sprintf("health-loop %s: %d polls, %d without an answering engine, longest gap %v",
		l.name, l.polls, l.gaps, l.longest.Round(time.Millisecond))
	if len(l.answers) > 0 {
		a := slices.Clone(l.answers)
		slices.Sort(a)
		note += fmt.Sprintf(", /health answered in %v median, %v at most", roundLatency(a[len(a)/2]), roundLatency(a[len(a)-1]))
	}
	if l.failed > 0 {
		note += fmt.Sprintf(", %d asks unanswered within %v", l.failed, l.timeout)
	}
	r.res.Notes = append(r.res.Notes, note)
}

func (r *runner) runHealthLoop(l *healthLoop) {
	defer close(l.done)
	client := &http.Client{Timeout: l.timeout}
	tick := time.NewTicker(healthPollEvery)
	defer tick.Stop()
	// stop ends a poll under way (a busy engine's /health takes seconds);
	// that poll does not count.
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	go func() {
		select {
		case <-l.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-ctx.Done():
			l.mu.Lock()
			if !l.gapStart.IsZero() {
				l.longest = max(l.longest, time.Since(l.gapStart))
			}
			l.mu.Unlock()
			return
		case <-tick.C:
		}
		served, took, failed := r.anyEngineHealthy(ctx, client, l.deployment)
		if ctx.Err() != nil {
			continue
		}
		now := time.Now()
		l.mu.Lock()
		l.polls++
		l.answers = append(l.answers, took...)
		l.failed += failed
		switch {
		case !served:
			l.gaps++
			if l.gapStart.IsZero() {
				l.gapStart = now
			}
		case !l.gapStart.IsZero():
			l.longest = max(l.longest, now.Sub(l.gapStart))
			l.gapStart = time.Time{}
		}
		l.mu.Unlock()
	}
}

// anyEngineHealthy reports whether some engine process serving deployment
// (its --model argument, or --served-model-name under a personality)
// answers 200 on /health; it asks them all at once, and says how long
// each 200 took.
func (r *runner) anyEngineHealthy(ctx context.Context, client *http.Client, deployment string) (ok bool, took []time.Duration, failed int) {
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for _, argv := range engineProcs(r.binaryPaths()...) {
		i := slices.Index(argv, "--model")
		if k := slices.Index(argv, "--served-model-name"); k >= 0 {
			i = k
		}
		j := slices.Index(argv, "--port")
		if i < 0 || j < 0 || i+1 >= len(argv) || j+1 >= len(argv) || argv[i+1] != deployment {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+argv[j+1]+"/health", nil)
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			resp, err := client.Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				return
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				took = append(took, time.Since(start))
			}
		}()
	}
	wg.Wait()
	return len(took) > 0, took, failed
}

// roundLatency rounds a latency for the summary: to the millisecond, or
// to 10 µs below one.
func roundLatency(d time.Duration) time.Duration {
	if d < time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Millisecond)
}
