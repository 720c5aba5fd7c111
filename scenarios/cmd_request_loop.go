package scenarios

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	// answeredAs, when set (answered-as=), is the model every answer
	// must name (a LoRA adapter answers as itself); another is an error.
	answeredAs string
	// viaGateway: each request goes to an observer's gateway, in turn,
	// instead of straight to an engine; stream asks for streamed answers.
	viaGateway, stream bool
	// only limits the nodes asked (on=); nil is every observer.
	only    []*node
	workers int
	// client sends the loop's requests: the runner's (3 s per request)
	// unless timeout= gave the loop one of its own. tokens is how many
	// tokens each request asks for exactly (0: at most 4, the runner's
	// default).
	client *http.Client
	tokens int
	// promptWords (prompt-words=) lengthens each prompt by that many
	// words, so that it spans KV blocks (a prefill then hands blocks over).
	promptWords int
	// header is what every request carries besides (priority=: the
	// cluster's priority header and the class).
	header []string
	// nextGateway (retry=next-gateway) retries a request on the next
	// gateway, as OpenAI's SDKs retry, when the connection was refused
	// or closed before any answer, or the answer was a 503 with
	// Retry-After; each gateway at most once.
	nextGateway bool
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
	// inFlight holds when each request not yet recorded was sent, by the
	// request's number (lastID numbers them).
	inFlight map[int]time.Time
	lastID   int
}

// loopRequest is one request of a loop.
type loopRequest struct {
	// sent: just before the request left; first: when its answer began
	// (the response head) or, when there was none, the failure; end: the
	// answer's last byte, or the failure.
	sent, first, end time.Time
	// node served it: the gateway's Llmgw-Node header, or the replica's
	// node (via=engines); replica is the gateway's Llmgw-Replica header,
	// or the row's replica.
	node, replica string
	err           string
	// gateway is the node whose gateway gave the final answer (via=gateway),
	// and binary the llmgw binary it ran then; attempts is how many
	// gateways were asked.
	gateway, binary string
	attempts        int
	// ttfb is the time from sending to the first byte of the answer:
	// a stream's first data event, a plain answer's head (zero for a
	// failure).
	ttfb time.Duration
}

// prompt is request seq's message: "ping N", and promptWords more words.
func (l *requestLoop) prompt(seq int) string {
	p := fmt.Sprintf("ping %d", seq)
	if l.promptWords > 0 {
		p += strings.Repeat(" lorem", l.promptWords)
	}
	return p
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
	action, err := d.nextPos("start, stop, expect-no-errors, expect-none-from, expect-spread, expect-cut, expect-ttfb, expect-refused or expect-fail-fast")
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
	case "expect-spread":
		out, err := r.loopSpread(d, l)
		return out, time.Time{}, err
	case "expect-cut":
		out, err := r.loopCut(d, l)
		return out, time.Time{}, err
	case "expect-ttfb":
		out, err := r.loopTTFB(d, l)
		return out, time.Time{}, err
	case "expect-refused":
		out, err := loopRefused(d, l)
		return out, time.Time{}, err
	case "expect-fail-fast":
		out, err := r.loopFailFast(d, l)
		return out, time.Time{}, err
	}
	return "", time.Time{}, usagef("request-loop: want start, stop, expect-no-errors, expect-none-from, expect-spread, expect-cut, expect-ttfb, expect-refused or expect-fail-fast, got %q", action)
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
	tokens, err := d.integer("tokens", 0)
	if err != nil {
		return "", time.Time{}, err
	}
	if d.has("tokens") && tokens < 1 {
		return "", time.Time{}, usagef("request-loop: tokens=%d: want at least 1", tokens)
	}
	words, err := d.integer("prompt-words", 0)
	if err != nil {
		return "", time.Time{}, err
	}
	if words < 0 || words > 100000 {
		return "", time.Time{}, usagef("request-loop: prompt-words=%d: want 0 to 100000", words)
	}
	retry, err := d.str("retry", "none")
	if err != nil {
		return "", time.Time{}, err
	}
	if retry != "none" && retry != "next-gateway" {
		return "", time.Time{}, usagef("request-loop: retry=%s: want none or next-gateway", retry)
	}
	if retry == "next-gateway" && via != "gateway" {
		return "", time.Time{}, usagef("request-loop: retry=next-gateway needs via=gateway")
	}
	var header []string
	if class, ok := d.kvRaw("priority"); ok {
		name := ""
		for i := 0; i+1 < len(r.cfg.nodeFlags); i += 2 {
			if r.cfg.nodeFlags[i] == "--priority-header" {
				name = r.cfg.nodeFlags[i+1]
			}
		}
		if name == "" || via != "gateway" {
			return "", time.Time{}, usagef("request-loop: priority=%s needs via=gateway and the cluster's priority-header=", class)
		}
		header = []string{name, class}
	}
	client := r.http
	if d.has("timeout") {
		timeout, err := d.duration("timeout", 0)
		if err != nil {
			return "", time.Time{}, err
		}
		// A client of the loop's own, keeping a connection per worker
		// to each gateway or engine.
		client = &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: max(4, workers), DisableCompression: true}}
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
	answeredAs, err := d.str("answered-as", "")
	if err != nil {
		return "", time.Time{}, err
	}
	l := &requestLoop{name: name, deployment: dep, answeredAs: answeredAs, viaGateway: via == "gateway", stream: stream, only: only, workers: workers,
		client: client, tokens: tokens, promptWords: words, header: header, nextGateway: retry == "next-gateway", stopping: make(chan struct{}), done: make(chan struct{}), minRoutable: -1,
		inFlight: map[int]time.Time{}}
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
	if l.nextGateway {
		out += ", retried on the next gateway as an SDK would"
	}
	if header != nil {
		out += ", priority " + header[1]
	}
	if workers > 1 {
		out += fmt.Sprintf(", %d at once", workers)
	}
	return out, time.Now(), nil
}

func (l *requestLoop) stop() {
	l.once.Do(func() { close(l.stopping) })
	<-l.done
}

// sdkRetries says whether OpenAI's SDKs would send a failed request again:
// the connection was refused, or closed before any answer, or the answer
// was a 503 that says when to come back (Retry-After). A timeout or any
// other answer is the caller's to see.
func sdkRetries(ans gatewayAnswer, err error) bool {
	if ans.status != 0 {
		return ans.status == http.StatusServiceUnavailable && ans.retryAfter
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	// net/http's own words for a keep-alive connection the server closed
	// as the request went out (errServerClosedIdle is not exported).
	return strings.Contains(err.Error(), "server closed idle connection")
}

// loopRefused is expect-refused match=TEXT: the loop sent requests,
// none was answered, and every error says TEXT (a model removed: 404).
func loopRefused(d *directive, l *requestLoop) (string, error) {
	match, err := d.need("match")
	if err != nil {
		return "", err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ok, errs, _ := tally(l.reqs)
	switch {
	case errs == 0:
		return fmt.Sprintf("no request was refused (%d answered)", ok), nil
	case ok > 0:
		return fmt.Sprintf("%d answered, %d refused", ok, errs), nil
	}
	for _, q := range l.reqs {
		if !strings.Contains(q.err, match) {
			return fmt.Sprintf("refused otherwise: %s", q.err), nil
		}
	}
	return fmt.Sprintf("every request refused with %q", match), nil
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
	if l.nextGateway {
		retried := 0
		for _, q := range l.reqs {
			if q.attempts > 1 {
				retried++
			}
		}
		note += fmt.Sprintf(", %d sent again to the next gateway", retried)
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
	// except-binary=NAME: failures whose last answer came from a gateway
	// running that binary are reported apart (the summary), not judged:
	// an old release's stopping gateway refuses what the new one serves.
	exceptBin, hasExcept := d.kvRaw("except-binary")
	if hasExcept {
		kept, apart := reqs[:0:0], 0
		for _, q := range reqs {
			if q.err != "" && q.binary == exceptBin {
				apart++
				continue
			}
			kept = append(kept, q)
		}
		reqs = kept
		r.res.Notes = append(r.res.Notes, fmt.Sprintf("request-loop %s: %d failed at gateways running binary %s (not judged)", name, apart, exceptBin))
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
	if hasExcept {
		verdict += " at gateways not running binary " + exceptBin
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
		if l.viaGateway {
			// The gateway routes and retries; the loop is only a client
			// (with retry=next-gateway, one that moves on as an SDK does).
			id, q := l.begin()
			for try := 0; ; try++ {
				gw := obs[(next+try)%len(obs)]
				ans, err := r.chatThroughGateway(r.ctx, l.client, gw.gateway(), l.deployment, l.stream, l.prompt(next), l.tokens, l.header...)
				q.end = time.Now()
				q.node, q.replica, q.first = ans.node, ans.replica, ans.head
				q.ttfb = 0
				if err == nil {
					q.ttfb = cmp.Or(ans.firstData, ans.head).Sub(q.sent)
				}
				q.gateway, q.binary, q.attempts = gw.name, gw.binaryName(), try+1
				if q.first.IsZero() {
					q.first = q.end
				}
				q.err = ""
				if err == nil && l.answeredAs != "" && ans.model != l.answeredAs {
					err = fmt.Errorf("answered as %q, want %q", ans.model, l.answeredAs)
				}
				if err != nil {
					q.err = gw.name + "'s gateway: " + err.Error()
				}
				if err == nil || !l.nextGateway || try+1 >= len(obs) || !sdkRetries(ans, err) {
					break
				}
			}
			l.record(id, q)
			continue
		}
		// Sent from before the routing read: a request routed by what
		// was true before an event counts as sent before it.
		id, q := l.begin()
		var rows []shardRow
		if err := r.get(r.ctx, n, "/v1/shards", &rows); err != nil {
			l.abandon(id)
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
			l.record(id, q)
			continue
		}
		row := routable[next%len(routable)]
		err := r.chatVia(r.ctx, l.client, row, l.tokens)
		var ae *apiError
		if err != nil && !errors.As(err, &ae) && len(routable) > 1 {
			l.mu.Lock()
			l.retries++
			l.mu.Unlock()
			row = routable[(next+1)%len(routable)]
			err = r.chatVia(r.ctx, l.client, row, l.tokens)
		}
		q.first, q.end, q.node, q.replica = time.Now(), time.Now(), row.Node, row.ReplicaID
		if err != nil {
			q.err = err.Error()
		}
		l.record(id, q)
	}
}

// begin notes a request about to be sent: in flight until recorded.
func (l *requestLoop) begin() (int, loopRequest) {
	q := loopRequest{sent: time.Now()}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastID++
	l.inFlight[l.lastID] = q.sent
	return l.lastID, q
}

// abandon forgets request id, which was never sent.
func (l *requestLoop) abandon(id int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.inFlight, id)
}

// record files request id, no longer in flight.
func (l *requestLoop) record(id int, q loopRequest) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.inFlight, id)
	l.reqs = append(l.reqs, q)
}

// unsettled counts the requests sent before cut that have not ended, and
// says how long the oldest of them has been in flight.
func (l *requestLoop) unsettled(cut time.Time) (int, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	var oldest time.Time
	for _, sent := range l.inFlight {
		if sent.Before(cut) {
			n++
			if oldest.IsZero() || sent.Before(oldest) {
				oldest = sent
			}
		}
	}
	if n == 0 {
		return 0, 0
	}
	return n, time.Since(oldest)
}

// loopSpread is expect-spread min-share=P%: every replica that answered
// requests of the loop (sent after after=, begun before before=) answered
// at least that share of them.
func (r *runner) loopSpread(d *directive, l *requestLoop) (string, error) {
	minShare, ok, err := percent(d, "min-share")
	if err != nil {
		return "", err
	}
	if !ok {
		return "", usagef("request-loop %s expect-spread: want min-share=P%%", l.name)
	}
	var from, until time.Time
	window := ""
	if ref, ok := d.kvRaw("after"); ok {
		if from, err = r.eventAt("after", ref); err != nil {
			return "", err
		}
		window += " sent after " + ref
	}
	if ref, ok := d.kvRaw("before"); ok {
		if until, err = r.eventAt("before", ref); err != nil {
			return "", err
		}
		window += " begun before " + ref
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	by := map[string]int{}
	total := 0
	for _, q := range l.reqs {
		if q.err != "" || (!from.IsZero() && !q.sent.After(from)) || (!until.IsZero() && !q.first.Before(until)) {
			continue
		}
		who := q.replica
		if who == "" {
			who = "node " + q.node
		}
		by[who]++
		total++
	}
	if total == 0 {
		return "no request" + window + " was answered", nil
	}
	names := make([]string, 0, len(by))
	for n := range by {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts, low []string
	for _, n := range names {
		share := 100 * float64(by[n]) / float64(total)
		parts = append(parts, fmt.Sprintf("%s %.1f%%", n, share))
		if share < minShare {
			low = append(low, n)
		}
	}
	r.res.Notes = append(r.res.Notes, fmt.Sprintf("request-loop %s spread of %d answers%s: %s", l.name, total, window, strings.Join(parts, ", ")))
	if len(low) > 0 {
		return fmt.Sprintf("below %s: %s (%s)", fmtPercent(minShare), strings.Join(low, ", "), strings.Join(parts, ", ")), nil
	}
	replicas := "replicas"
	if len(names) == 1 {
		replicas = "replica"
	}
	return fmt.Sprintf("%d %s answered, each at least %s of the answers%s", len(names), replicas, fmtPercent(minShare), window), nil
}

// loopCut is expect-cut NODE at=EVENT: every request whose answer NODE had
// begun (its head received) and not finished at EVENT ended with an error,
// rather than being answered. It reads the loop's record: wait for the
// requests to end first (wait-until settled).
func (r *runner) loopCut(d *directive, l *requestLoop) (string, error) {
	ref, err := d.nextPos("the node whose answers were cut")
	if err != nil {
		return "", err
	}
	ns, labels, err := r.resolveNodes(r.ctx, []string{ref})
	if err != nil {
		return "", err
	}
	atRef, err := d.need("at")
	if err != nil {
		return "", err
	}
	at, err := r.eventAt("at", atRef)
	if err != nil {
		return "", err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	inFlight, failed := 0, 0
	var first string
	for _, q := range l.reqs {
		if q.node != ns[0].name || !q.first.Before(at) || !q.end.After(at) {
			continue
		}
		inFlight++
		if q.err != "" {
			failed++
			if first == "" {
				first = q.err
			}
		}
	}
	r.res.Notes = append(r.res.Notes, fmt.Sprintf("request-loop %s: %d answers %s had begun at %s, %d of them cut", l.name, inFlight, labels[0], atRef, failed))
	switch {
	case inFlight == 0:
		return fmt.Sprintf("no answer of %s was under way at %s", labels[0], atRef), nil
	case failed < inFlight:
		return fmt.Sprintf("%d of the %d answers %s had begun at %s were completed anyway", inFlight-failed, inFlight, labels[0], atRef), nil
	}
	return fmt.Sprintf("every answer %s had begun at %s ended with an error (%s)", labels[0], atRef, errorKind(first)), nil
}

// loopTTFB is expect-ttfb under=D [quantile=P%] [after=EVENT]: the
// given quantile (95% unless said) of the times to first byte of the
// loop's answered requests (sent after after=) is within D. The figures
// (p50, the quantile, max, count) go to the summary.
func (r *runner) loopTTFB(d *directive, l *requestLoop) (string, error) {
	under, err := d.duration("under", 0)
	if err != nil {
		return "", err
	}
	if under <= 0 {
		return "", usagef("request-loop %s expect-ttfb: want under=DURATION", l.name)
	}
	q, ok, err := percent(d, "quantile")
	if err != nil {
		return "", err
	}
	if !ok {
		q = 95
	}
	var from time.Time
	window := ""
	if ref, ok := d.kvRaw("after"); ok {
		if from, err = r.eventAt("after", ref); err != nil {
			return "", err
		}
		window = " sent after " + ref
	}
	l.mu.Lock()
	var ds []time.Duration
	for _, x := range l.reqs {
		if x.err == "" && x.ttfb > 0 && (from.IsZero() || x.sent.After(from)) {
			ds = append(ds, x.ttfb)
		}
	}
	l.mu.Unlock()
	if len(ds) == 0 {
		return "no request" + window + " was answered", nil
	}
	slices.Sort(ds)
	at := func(p float64) time.Duration { return ds[min(len(ds)-1, int(math.Ceil(p/100*float64(len(ds))))-1)] }
	got := at(q)
	name := "p" + strconv.FormatFloat(q, 'f', -1, 64)
	r.res.Notes = append(r.res.Notes, fmt.Sprintf("request-loop %s time to first byte of %d answers%s: p50 %v, %s %v, max %v", l.name, len(ds), window,
		at(50).Round(time.Millisecond), name, got.Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond)))
	if got > under {
		return fmt.Sprintf("%s time to first byte %v, over %v", name, got.Round(time.Millisecond), under), nil
	}
	return fmt.Sprintf("%s time to first byte within %v", name, under), nil
}

// loopFailFast judges the failures of requests sent after a mark: each an
// OpenAI-shaped error (an error code in its body), none later than under
// after its sending. The slowest goes to the notes.
func (r *runner) loopFailFast(d *directive, l *requestLoop) (string, error) {
	under, err := d.duration("under", 0)
	if err != nil {
		return "", err
	}
	if under <= 0 {
		return "", usagef("request-loop %s expect-fail-fast: want under=DURATION", l.name)
	}
	var from time.Time
	if ref, ok := d.kvRaw("after"); ok {
		if from, err = r.eventAt("after", ref); err != nil {
			return "", err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var slowest time.Duration
	failed, answered := 0, 0
	codes := map[string]int{}
	for _, q := range l.reqs {
		if q.sent.Before(from) {
			continue
		}
		if q.err == "" {
			answered++
			continue
		}
		failed++
		slowest = max(slowest, q.end.Sub(q.sent))
		code := "not an OpenAI error"
		if i := strings.Index(q.err, `"code":"`); i >= 0 {
			code = errorKind(q.err)
		}
		codes[code]++
	}
	var cs []string
	for _, c := range slices.Sorted(maps.Keys(codes)) {
		cs = append(cs, fmt.Sprintf("%s %d", c, codes[c]))
	}
	r.res.Notes = append(r.res.Notes, fmt.Sprintf("request-loop %s after the mark: %d answered, %d failed (%s), the slowest failure in %v",
		l.name, answered, failed, strings.Join(cs, ", "), slowest.Round(time.Millisecond)))
	switch {
	case failed == 0:
		return "no request failed", nil
	case codes["not an OpenAI error"] > 0:
		return fmt.Sprintf("%d failures without an OpenAI error", codes["not an OpenAI error"]), nil
	case slowest > under:
		return fmt.Sprintf("the slowest failure took %v, over %v", slowest.Round(time.Millisecond), under), nil
	}
	return fmt.Sprintf("every failure an OpenAI error within %v", under), nil
}

// errorKind is the deterministic part of a loop request's error: what a
// stream that broke off carried as its error's code, else the HTTP status.
func errorKind(e string) string {
	if i := strings.Index(e, `"code":"`); i >= 0 {
		rest := e[i+len(`"code":"`):]
		if j := strings.IndexByte(rest, '"'); j >= 0 {
			return rest[:j]
		}
	}
	if i := strings.Index(e, "HTTP "); i >= 0 && len(e) >= i+8 {
		return e[i : i+8]
	}
	return "an error"
}
