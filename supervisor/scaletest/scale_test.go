package scaletest

import (
	"context"
	"errors"
	"flag"
	"net/http"
	_ "net/http/pprof"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	sizes   = flag.String("nodes", "25", "cluster sizes to run, comma-separated (make scale runs 25,50,100,200,500)")
	budgets = flag.Bool("budgets", true, "fail a run that misses issue 26's budgets (make scale reports them instead)")
	pprof   = flag.String("pprof", "", "serve net/http/pprof here during the run (a loopback host:port), to profile a size as it runs")
)

// TestScale runs a cluster of each size and prints its row. At the
// default 25 nodes it is the smoke run of `make test`, held to the
// budgets of a 500-node cluster's node.
func TestScale(t *testing.T) {
	if *pprof != "" {
		srv := &http.Server{Addr: *pprof, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.ListenAndServe() }()
		defer srv.Close()
	}
	var rows []string
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			t.Fatalf("-nodes: %q is not a number: give sizes like 25,50,100", f)
		}
		res, err := Run(context.Background(), Options{Nodes: n, Dir: t.TempDir(), Progress: func(format string, args ...any) {
			t.Logf("%d nodes: "+format, append([]any{n}, args...)...)
		}})
		rows = append(rows, res.Row(err))
		if err != nil {
			// Past what this machine's cores carry, a size cannot settle:
			// the sweep stops there and says why.
			if *budgets {
				t.Errorf("%d nodes: %v", n, err)
			} else {
				t.Logf("the sweep stops at %d nodes: %v", n, err)
			}
			break
		}
		if err := res.Missed(); err != nil {
			if *budgets {
				t.Errorf("%d nodes miss the budgets: %v", n, err)
			} else {
				t.Logf("%d nodes miss the budgets: %v", n, err)
			}
		}
	}
	t.Log("\n" + Header + "\n" + strings.Join(rows, "\n"))
}

// A size that stopped early says where, and shows no figure it did not
// measure.
func TestRowOfAStoppedRun(t *testing.T) {
	r := Result{Nodes: 100, Started: 570 * time.Millisecond, Members: 5610 * time.Millisecond}
	got := r.Row(errors.New("every node plans every shard: not within 3m0s"))
	want := "| 100 | 0.57 s | 5.61 s | not within the wait | – | – | – | – | – | – | – | – |"
	if got != want {
		t.Errorf("row\n%s\nwant\n%s", got, want)
	}
	if n, m := strings.Count(got, "|"), strings.Count(Header[:strings.Index(Header, "\n")], "|"); n != m {
		t.Errorf("%d cells' borders, the header has %d", n, m)
	}
}
