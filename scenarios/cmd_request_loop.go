package scenarios

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// requestLoop is a background client sending chat completions to a
// deployment. via=engines, the way a router that honours leases would:
// before every request it reads /v1/shards from a node and picks a replica
// whose lease is valid; a connection-level failure is retried once on
// another replica; an HTTP error, an answer without choices, or no
// routable replica at all is an error. via=gateway, as a client of the
// nodes' gateways, which route and retry themselves.
//
// Every request is recorded (when it was sent, when its answer began and
// ended, which node served it), so verdicts can look at a window of time:
// the requests answered before a stop, or those sent after a freeze.
type requestLoop struct {
	name, deployment string
	// viaGateway: each request goes to an observer's gateway, in turn,
	// instead of straight to an engine; stream asks for streamed answers.
	viaGateway, stream bool
	// only limits the nodes asked (on=); nil is every observer.
	only    []*node
	workers int
	// stopping is closed to ask the loop to stop, done once every worker
	// has.
	stopping, done chan struct{}
	once           sync.Once

	mu          sync.Mutex
	next        int // the next node (and replica) in turn
	retries     int
	minRoutable int // fewest routable replicas seen; -1 before any
	reqs        []loopRequest
	noteAdded   bool
}

// loopRequest is one request of a loop.
type loopRequest struct {
	// sent: just before the request left; first: when its answer began
	// (the response head) or, when there was none, the failure; end: the
	// answer's last byte, or the failure.
	sent, first, end time.Time
	// node served it: the gateway's Llmgw-Node header, or the replica's
	// node (via=engines).
	node string
	err  string
}

// workerStagger spaces the workers' first requests, so that long streams
// do not all begin and end together.
const workerStagger = 50 * time.Millisecond

func (r *runner) cmdRequestLoop(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	name, err := d.nextPos("loop name")
	if err != nil {
		return "", time.Time{}, err
	}
	action, err := d.nextPos("start, stop, expect-no-errors or expect-none-from")
	if err != nil {
		return "", time.Time{}, err
	}
	if action == "start" {
		return r.startRequestLoop(d, name)
	}
	l, ok := r.loops[name]
	if !ok {
		return "", time.Time{}, usagef("request-loop %s: not started", name)
	}
	switch action {
	case "stop":
		l.stop()
		r.addLoopNote(l)
		return "stopped", time.Now(), nil
	case "expect-no-errors":
		out, err := r.loopVerdict(d, name)
		return out, time.Time{}, err
	case "expect-none-from":
		out, err := r.loopNoneFrom(d, l)
		return out, time.Time{}, err
	}
	return "", time.Time{}, usagef("request-loop: want start, stop, expect-no-errors or expect-none-from, got %q", action)
}

func (r *runner) startRequestLoop(d *directive, name string) (string, time.Time, error) {
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
	workers, err := d.integer("workers", 1)
	if err != nil {
		return "", time.Time{}, err
	}
	if workers < 1 {
		return "", time.Time{}, usagef("request-loop: workers=%d: want at least 1", workers)
	}
	var only []*node
	var onLabels []string
	if refs, ok := d.list("on"); ok {
		if len(refs) == 0 {
			return "", time.Time{}, usagef("request-loop: on=() names no node")
		}
		if only, onLabels, err = r.resolveNodes(r.ctx, refs); err != nil {
			return "", time.Time{}, err
		}
	}
	l := &requestLoop{name: name, deployment: dep, viaGateway: via == "gateway", stream: stream, only: only, workers: workers,
		stopping: make(chan struct{}), done: make(chan struct{}), minRoutable: -1}
	r.loops[name] = l
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.runRequestLoop(l, time.Duration(i)*workerStagger)
		}()
	}
	go func() {
		wg.Wait()
		close(l.done)
	}()
	out := "started: chat completions to " + dep
	switch {
	case l.viaGateway && only != nil:
		out += " through the gateway of " + strings.Join(onLabels, ", ")
	case l.viaGateway:
		out += " through the nodes' gateways"
	case only != nil:
		out += ", routed by what " + strings.Join(onLabels, ", ") + " report,"
	}
	out += " in a loop"
	if workers > 1 {
		out += fmt.Sprintf(", %d at once", workers)
	}
	return out, time.Now(), nil
}

func (l *requestLoop) stop() {
	l.once.Do(func() { close(l.stopping) })
	<-l.done
}

// tally counts answered and failed requests, with the first errors.
func tally(reqs []loopRequest) (ok, errs int, first []string) {
	for _, q := range reqs {
		if q.err == "" {
			ok++
			continue
		}
		errs++
		if len(first) < 3 {
			first = append(first, q.err)
		}
	}
	return ok, errs, first
}

// addLoopNote adds the loop's counters to the summary's notes, once: the
// counts, the share answered, and which nodes served.
func (r *runner) addLoopNote(l *requestLoop) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.noteAdded {
		return
	}
	l.noteAdded = true
	ok, errs, _ := tally(l.reqs)
	note := fmt.Sprintf("request-loop %s: %d answered, %d errors", l.name, ok, errs)
	if l.viaGateway {
		note = fmt.Sprintf("request-loop %s (gateways): %d answered, %d errors", l.name, ok, errs)
	}
	if ok+errs > 0 && errs > 0 {
		note += fmt.Sprintf(" (%.2f%% answered)", 100*float64(ok)/float64(ok+errs))
	}
	if !l.viaGateway {
		note += fmt.Sprintf(", %d retried, min %d routable", l.retries, l.minRoutable)
	}
	served := map[string]int{}
	for _, q := range l.reqs {
		if q.err == "" && q.node != "" {
			served[q.node]++
		}
	}
	if len(served) > 0 {
		names := make([]string, 0, len(served))
		for n := range served {
			names = append(names, n)
		}
		sort.Strings(names)
		var parts []string
		for _, n := range names {
			parts = append(parts, n+" "+strconv.Itoa(served[n]))
		}
		note += ", served by " + strings.Join(parts, " ")
	}
	r.res.Notes = append(r.res.Notes, note)
}

// eventAt reads "EVENT" or "EVENT+DURATION" (the time of a recorded event,
// plus a duration).
func (r *runner) eventAt(key, ref string) (time.Time, error) {
	name, plus, hasPlus := strings.Cut(ref, "+")
	at, ok := r.events[name]
	if !ok {
		return time.Time{}, usagef("%s=%s: no event %q yet (events are command names and mark= names)", key, ref, name)
	}
	if hasPlus {
		d, err := time.ParseDuration(plus)
		if err != nil || d < 0 {
			return time.Time{}, usagef("%s=%s: want EVENT or EVENT+DURATION such as freeze+4s", key, ref)
		}
		at = at.Add(d)
	}
	return at, nil
}

// percent reads key=P% (0 < P <= 100).
func percent(d *directive, key string) (float64, bool, error) {
	s, err := d.str(key, "")
	if err != nil || s == "" {
		return 0, false, err
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	if err != nil || !strings.HasSuffix(s, "%") || v <= 0 || v > 100 {
		return 0, false, usagef("%s=%s: want a percentage such as 99.9%%", key, s)
	}
	return v, true, nil
}

// loopVerdict is expect-no-errors: every request answered (or, with
// min-success, at least that share), counting only those begun before an
// event with before=.
func (r *runner) loopVerdict(d *directive, name string) (string, error) {
	minWant, err := d.integer("min-routable", 0)
	if err != nil {
		return "", err
	}
	minShare, hasShare, err := percent(d, "min-success")
	if err != nil {
		return "", err
	}
	beforeRef, hasBefore := d.kvRaw("before")
	var cut time.Time
	if hasBefore {
		if cut, err = r.eventAt("before", beforeRef); err != nil {
			return "", err
		}
	}
	l, ok := r.loops[name]
	if !ok {
		return "", usagef("request-loop %s: not started", name)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	reqs := l.reqs
	inFlight := 0
	if hasBefore {
		reqs = nil
		for _, q := range l.reqs {
			if q.first.Before(cut) {
				reqs = append(reqs, q)
				if q.end.After(cut) {
					inFlight++
				}
			}
		}
	}
	answered, errs, first := tally(reqs)
	total := answered + errs
	if hasBefore {
		r.res.Notes = append(r.res.Notes, fmt.Sprintf("request-loop %s, begun before %s: %d answered, %d errors, %d in flight at it", name, beforeRef, answered, errs, inFlight))
	}
	var verdict string
	switch {
	case total == 0 && hasBefore:
		return "no request was answered before " + beforeRef, nil
	case answered == 0:
		return "no request was answered yet", nil
	case hasShare && float64(errs) > (1-minShare/100)*float64(total)+1e-9:
		return fmt.Sprintf("%d of %d requests failed: fewer than %s answered; first: %v", errs, total, fmtPercent(minShare), first), nil
	case hasShare:
		verdict = "at least " + fmtPercent(minShare) + " of requests answered"
	case errs > 0:
		return fmt.Sprintf("%d of %d requests failed; first: %v", errs, total, first), nil
	default:
		verdict = "no errors"
	}
	if hasBefore {
		verdict += " among those begun before " + beforeRef
		if inFlight > 0 {
			verdict += ", some still in flight at it"
		} else {
			verdict += ", none still in flight at it"
		}
	}
	switch {
	case minWant > 0 && l.minRoutable < minWant:
		return fmt.Sprintf("%s, but once only %d routable replicas (want at least %d)", verdict, l.minRoutable, minWant), nil
	case minWant > 0:
		return fmt.Sprintf("%s; never fewer than %d routable replicas", verdict, minWant), nil
	}
	return verdict, nil
}

func fmtPercent(p float64) string { return strconv.FormatFloat(p, 'f', -1, 64) + "%" }

// loopNoneFrom is expect-none-from NODE after=EVENT[+DURATION]: no request
// sent after that moment was served by NODE, and some were answered.
func (r *runner) loopNoneFrom(d *directive, l *requestLoop) (string, error) {
	ref, err := d.nextPos("the node that must serve none")
	if err != nil {
		return "", err
	}
	ns, labels, err := r.resolveNodes(r.ctx, []string{ref})
	if err != nil {
		return "", err
	}
	afterRef, err := d.need("after")
	if err != nil {
		return "", err
	}
	cut, err := r.eventAt("after", afterRef)
	if err != nil {
		return "", err
	}
	// before=EVENT ends the window: only answers begun before it count
	// (a gang torn down and formed again serves from the same node later).
	var until time.Time
	window := afterRef
	beforeRef, hasBefore := d.kvRaw("before")
	if hasBefore {
		if until, err = r.eventAt("before", beforeRef); err != nil {
			return "", err
		}
		window += " (until " + beforeRef + ")"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	answered, from := 0, 0
	var last time.Time // the last request NODE served was sent
	for _, q := range l.reqs {
		if q.err == "" && q.node == ns[0].name && q.sent.After(last) {
			last = q.sent
		}
		if q.err != "" || !q.sent.After(cut) || (hasBefore && !q.first.Before(until)) {
			continue
		}
		answered++
		if q.node == ns[0].name {
			from++
		}
	}
	if base, _, _ := strings.Cut(afterRef, "+"); !last.IsZero() {
		r.res.Notes = append(r.res.Notes, fmt.Sprintf("request-loop %s: the last request %s served was sent %.2fs after %s", l.name, labels[0], last.Sub(r.events[base]).Seconds(), base))
	}
	switch {
	case answered == 0:
		return "no request sent after " + window + " was answered", nil
	case from > 0:
		return fmt.Sprintf("%d of the %d requests answered since %s were served by %s", from, answered, window, labels[0]), nil
	}
	return "none of the requests sent after " + window + " was served by " + labels[0], nil
}

// runRequestLoop is one worker of the loop.
func (r *runner) runRequestLoop(l *requestLoop, delay time.Duration) {
	pause := 20*time.Millisecond + delay
	for {
		select {
		case <-l.stopping:
			return
		case <-time.After(pause):
		}
		pause = 20 * time.Millisecond
		obs := r.observers(l.only)
		if len(obs) == 0 {
			continue
		}
		l.mu.Lock()
		next := l.next
		l.next++
		l.mu.Unlock()
		n := obs[next%len(obs)]
		q := loopRequest{sent: time.Now()}
		if l.viaGateway {
			// The gateway routes and retries; the loop is only a client.
			var err error
			q.node, q.first, err = r.chatThroughGateway(r.ctx, n.gateway(), l.deployment, l.stream, next)
			q.end = time.Now()
			if q.first.IsZero() {
				q.first = q.end
			}
			if err != nil {
				q.err = n.name + "'s gateway: " + err.Error()
			}
			l.record(q)
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
			q.first, q.end, q.err = time.Now(), time.Now(), "no replica with a valid lease"
			l.record(q)
			continue
		}
		row := routable[next%len(routable)]
		err := r.chat(r.ctx, row)
		var ae *apiError
		if err != nil && !errors.As(err, &ae) && len(routable) > 1 {
			l.mu.Lock()
			l.retries++
			l.mu.Unlock()
			row = routable[(next+1)%len(routable)]
			err = r.chat(r.ctx, row)
		}
		q.first, q.end, q.node = time.Now(), time.Now(), row.Node
		if err != nil {
			q.err = err.Error()
		}
		l.record(q)
	}
}

func (l *requestLoop) record(q loopRequest) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reqs = append(l.reqs, q)
}
