package scenarios

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const sample = `# A comment.
# labels: short, demo
# requires: process-runtime

cluster nodes=3 labels=(zone=a,rack=b)
----
3 nodes up

# Between commands.
place chat model="demo/tiny chat" args=(--x,"a,b")
----
ok

expect models
----
----
line one

line three
----
----

wait-until members alive=3 within 10s
----
`

func TestParseKeepsTheFileForRewrite(t *testing.T) {
	s, err := parseScript("x.txt", sample)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.render(); got != sample {
		t.Fatalf("render changed the file:\n%s\n--- want:\n%s", got, sample)
	}
	if strings.Join(s.labels, " ") != "short demo" || strings.Join(s.requires, " ") != "process-runtime" {
		t.Fatalf("labels %q requires %q", s.labels, s.requires)
	}
	var ds []*directive
	for _, sg := range s.segs {
		if sg.d != nil {
			ds = append(ds, sg.d)
		}
	}
	if len(ds) != 4 {
		t.Fatalf("%d directives, want 4", len(ds))
	}
	if ds[2].expected != "line one\n\nline three" || !ds[2].double {
		t.Fatalf("fenced output: %q", ds[2].expected)
	}
	p := ds[1]
	if m, _ := p.str("model", ""); m != "demo/tiny chat" {
		t.Fatalf("quoted value: %q", m)
	}
	if a, _ := p.list("args"); strings.Join(a, "|") != "--x|a,b" {
		t.Fatalf("list with a quoted comma: %q", a)
	}
	if name, _ := p.nextPos("name"); name != "chat" {
		t.Fatalf("positional: %q", name)
	}
	if err := p.unused(); err != nil {
		t.Fatalf("all used, yet: %v", err)
	}
	w := ds[3]
	w.positional()
	if err := w.unused(); err == nil || !strings.Contains(err.Error(), "alive=") {
		t.Fatalf("unused alive= not reported: %v", err)
	}
}

func TestRewriteFillsOutputs(t *testing.T) {
	s, err := parseScript("x.txt", "a\n----\n\nb x=1\n----\nold\n")
	if err != nil {
		t.Fatal(err)
	}
	s.segs[0].d.expected = "one"
	s.segs[2].d.expected = "two\n\nthree"
	want := "a\n----\none\n\nb x=1\n----\n----\ntwo\n\nthree\n----\n----\n"
	if got := s.render(); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	if _, err := parseScript("y.txt", want); err != nil {
		t.Fatalf("rewritten file does not parse: %v", err)
	}
}

func TestMalformedFilesFail(t *testing.T) {
	for name, text := range map[string]string{
		"no separator":    "cluster nodes=3\nok\n",
		"separator alone": "----\nok\n",
		"open fence":      "cluster nodes=3\n----\n----\nok\n",
		"open list":       "place x args=(a,b\n----\n",
		"open quote":      "place x model=\"m\n----\n",
		"key twice":       "place x model=a model=b\n----\n",
	} {
		if _, err := parseScript(name, text); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestUnknownCommandsAndKeysFailBeforeAnythingStarts(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{
		"unknown-command.txt": "cluster nodes=1\n----\n\nsleep 1s\n----\n",
		"unknown-key.txt":     "cluster nodes=1 colour=blue\n----\n",
	} {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		// No binary: had validation not failed first, Run would complain
		// about that instead.
		_, err := Run(context.Background(), Options{}, f)
		if err == nil || !strings.Contains(err.Error(), "unknown") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestDiffAssignments(t *testing.T) {
	a := []assignment{{ShardID: "a-0", Node: "n1", GPUs: []int{0}}, {ShardID: "b-0", Node: "n2", GPUs: []int{0, 1, 2, 3}}}
	b := []assignment{{ShardID: "a-0", Node: "n3", GPUs: []int{2}}, {ShardID: "c-0", Node: "n4", GPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}}}
	got := strings.Join(diffAssignments(a, b), "\n")
	want := "~ a-0 n1 gpus 0 -> n3 gpus 2\n- b-0 on n2\n+ c-0 on n4 gpus 0-7"
	if got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	if d := diffAssignments(a, a); len(d) != 0 {
		t.Fatalf("no change, yet %v", d)
	}
}

func TestSummaryColumns(t *testing.T) {
	out := Summary([]Result{
		{Name: "node-crash", Passed: true, Profile: "local", Nodes: 3, Duration: 2 * time.Second,
			Measures: []Measure{{Name: "detection", D: 800 * time.Millisecond, Max: 3 * time.Second}, {Name: "full-strength", D: 6 * time.Second, Max: 5 * time.Second}, {Name: "rollout", D: time.Second}}},
		{Name: "agent-restart", Skipped: true, Why: "requires the process runtime"},
	})
	for _, want := range []string{"node-crash", "PASS", "0.80s/3s", "6.00s/5s!", "rollout=1.00s", "SKIP", "requires the process runtime"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}

// The loop's verdicts count the window they are asked about: before= the
// requests whose answer began before the event (a stream in flight at it
// included, a request refused after it not), min-success= a share, and
// expect-none-from the requests sent after a moment.
func TestRequestLoopVerdictsCountTheirWindow(t *testing.T) {
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	n1, n2 := &node{name: "n1"}, &node{name: "n2"}
	r := &runner{ctx: context.Background(), commands: commandTable(), clusterStarted: true, res: &Result{},
		nodes: []*node{n1, n2}, byName: map[string]*node{"n1": n1, "n2": n2}, aliases: map[string]string{"sleeper": "n1"},
		events: map[string]time.Time{"stop": t0, "early": at(-5 * time.Second)}, loops: map[string]*requestLoop{}}
	l := &requestLoop{name: "clients", viaGateway: true, stopping: make(chan struct{}), done: make(chan struct{}), reqs: []loopRequest{
		{sent: at(-2 * time.Second), first: at(-2 * time.Second), end: at(-time.Second), node: "n1"},
		{sent: at(-time.Second), first: at(-time.Second), end: at(time.Second), node: "n2"},                                      // in flight at stop
		{sent: at(-time.Millisecond), first: at(5 * time.Millisecond), end: at(5 * time.Millisecond), err: "HTTP 503: stopping"}, // refused just after
		{sent: at(time.Second), first: at(time.Second), end: at(time.Second), err: "connection refused"},
	}}
	close(l.done)
	r.loops["clients"] = l
	check := func(line, want string) {
		t.Helper()
		d, err := parseDirective(line, 1)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.exec(d)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if got != want {
			t.Errorf("%s:\n got %q\nwant %q", line, got, want)
		}
	}
	check("request-loop clients expect-no-errors", "2 of 4 requests failed; first: [HTTP 503: stopping connection refused]")
	check("request-loop clients expect-no-errors before=stop", "no errors among those begun before stop, some still in flight at it")
	check("request-loop clients expect-no-errors before=stop+2s", "2 of 4 requests failed; first: [HTTP 503: stopping connection refused]")
	check("request-loop clients expect-no-errors before=early", "no request was answered before early")
	check("request-loop clients expect-no-errors min-success=50%", "at least 50% of requests answered")
	check("request-loop clients expect-no-errors min-success=99.9%", "2 of 4 requests failed: fewer than 99.9% answered; first: [HTTP 503: stopping connection refused]")
	check("expect request-loop clients min-success=50% before=stop", "at least 50% of requests answered among those begun before stop, some still in flight at it")
	check("request-loop clients expect-none-from sleeper after=stop", "no request sent after stop was answered")
	l.reqs = append(l.reqs, loopRequest{sent: at(1500 * time.Millisecond), first: at(1600 * time.Millisecond), end: at(1700 * time.Millisecond), node: "n2"})
	check("request-loop clients expect-none-from sleeper after=stop", "none of the requests sent after stop was served by sleeper")
	check("request-loop clients expect-none-from n2 after=stop+1s", "1 of the 1 requests answered since stop+1s were served by n2")
	check("request-loop clients expect-none-from n1 after=early", "1 of the 3 requests answered since early were served by n1")
}
