package scenarios

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// requestLoop is a background client sending chat completions to a
// deployment, the way a router that honours leases would: before every
// request it reads /v1/shards from a node and picks a replica whose lease
// is valid. A connection-level failure is retried once on another replica;
// an HTTP error, an answer without choices, or no routable replica at all
// is an error.
type requestLoop struct {
	name, deployment string
	// viaGateway: each request goes to an observer's gateway, in turn,
	// instead of straight to an engine; stream asks for streamed answers.
	viaGateway, stream bool
	// stopping is closed to ask the loop to stop, done once it has.
	stopping, done chan struct{}
	once           sync.Once

	mu                sync.Mutex
	ok, errs, retries int
	minRoutable       int // fewest routable replicas seen; -1 before any
	firstErrs         []string
	noteAdded         bool
}

func (r *runner) cmdRequestLoop(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	name, err := d.nextPos("loop name")
	if err != nil {
		return "", time.Time{}, err
	}
	action, err := d.nextPos("start, stop or expect-no-errors")
	if err != nil {
		return "", time.Time{}, err
	}
	switch action {
	case "start":
		dep, err := d.need("deployment")
		if err != nil {
			return "", time.Time{}, err
		}
		if _, ok := r.loops[name]; ok {
			return "", time.Time{}, usagef("request-loop %s: started already", name)
		}
		via, err := d.str("via", "engines")
		if err != nil {
			return "", time.Time{}, err
		}
		if via != "gateway" && via != "engines" {
			return "", time.Time{}, usagef("request-loop: via=%s: want gateway or engines", via)
		}
		stream, err := d.boolean("stream", false)
		if err != nil {
			return "", time.Time{}, err
		}
		l := &requestLoop{name: name, deployment: dep, viaGateway: via == "gateway", stream: stream,
			stopping: make(chan struct{}), done: make(chan struct{}), minRoutable: -1}
		r.loops[name] = l
		go r.runRequestLoop(l)
		if l.viaGateway {
			return "started: chat completions to " + dep + " through the nodes' gateways in a loop", time.Now(), nil
		}
		return "started: chat completions to " + dep + " in a loop", time.Now(), nil
	case "stop":
		l, ok := r.loops[name]
		if !ok {
			return "", time.Time{}, usagef("request-loop %s: not started", name)
		}
		l.stop()
		r.addLoopNote(l)
		return "stopped", time.Now(), nil
	case "expect-no-errors":
		out, err := r.loopVerdict(d, name)
		return out, time.Time{}, err
	}
	return "", time.Time{}, usagef("request-loop: want start, stop or expect-no-errors, got %q", action)
}

func (l *requestLoop) stop() {
	l.once.Do(func() { close(l.stopping) })
	<-l.done
}

// addLoopNote adds the loop's counters to the summary's notes, once.
func (r *runner) addLoopNote(l *requestLoop) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.noteAdded {
		return
	}
	l.noteAdded = true
	if l.viaGateway {
		r.res.Notes = append(r.res.Notes, fmt.Sprintf("request-loop %s (gateways): %d answered, %d errors", l.name, l.ok, l.errs))
		return
	}
	r.res.Notes = append(r.res.Notes, fmt.Sprintf("request-loop %s: %d answered, %d errors, %d retried, min %d routable", l.name, l.ok, l.errs, l.retries, l.minRoutable))
}

func (r *runner) loopVerdict(d *directive, name string) (string, error) {
	minWant, err := d.integer("min-routable", 0)
	if err != nil {
		return "", err
	}
	l, ok := r.loops[name]
	if !ok {
		return "", usagef("request-loop %s: not started", name)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.errs > 0:
		return fmt.Sprintf("%d of %d requests failed; first: %v", l.errs, l.errs+l.ok, l.firstErrs), nil
	case l.ok == 0:
		return "no request was answered yet", nil
	case minWant > 0 && l.minRoutable < minWant:
		return fmt.Sprintf("no errors, but once only %d routable replicas (want at least %d)", l.minRoutable, minWant), nil
	case minWant > 0:
		return fmt.Sprintf("no errors; never fewer than %d routable replicas", minWant), nil
	}
	return "no errors", nil
}

func (r *runner) runRequestLoop(l *requestLoop) {
	defer close(l.done)
	next := 0
	for {
		select {
		case <-l.stopping:
			return
		case <-time.After(20 * time.Millisecond):
		}
		obs := r.observers(nil)
		if len(obs) == 0 {
			continue
		}
		n := obs[next%len(obs)]
		next++
		if l.viaGateway {
			// The gateway routes and retries; the loop is only a client.
			if err := r.chatThroughGateway(r.ctx, n.gateway(), l.deployment, l.stream); err != nil {
				l.fail(n.name + "'s gateway: " + err.Error())
				continue
			}
			l.mu.Lock()
			l.ok++
			l.mu.Unlock()
			continue
		}
		var rows []shardRow
		if err := r.get(r.ctx, n, "/v1/shards", &rows); err != nil {
			continue // that node is going away: ask another next time
		}
		var routable []shardRow
		for _, row := range rows {
			if row.Deployment == l.deployment && row.Lease == "valid" && row.URL != "" {
				routable = append(routable, row)
			}
		}
		l.mu.Lock()
		if l.minRoutable < 0 || len(routable) < l.minRoutable {
			l.minRoutable = len(routable)
		}
		l.mu.Unlock()
		if len(routable) == 0 {
			l.fail("no replica with a valid lease")
			continue
		}
		first := routable[next%len(routable)]
		err := r.chat(r.ctx, first)
		var ae *apiError
		if err != nil && !errors.As(err, &ae) && len(routable) > 1 {
			l.mu.Lock()
			l.retries++
			l.mu.Unlock()
			err = r.chat(r.ctx, routable[(next+1)%len(routable)])
		}
		if err != nil {
			l.fail(err.Error())
			continue
		}
		l.mu.Lock()
		l.ok++
		l.mu.Unlock()
	}
}

func (l *requestLoop) fail(msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs++
	if len(l.firstErrs) < 3 {
		l.firstErrs = append(l.firstErrs, msg)
	}
}
