package gossip

import (
	"fmt"
	"slices"
	"testing"

	"github.com/hashicorp/memberlist"
)

// A record that changes again before its fan-out reached every member goes
// on in its newest bytes, once to each member; names take turns.
func TestBigQueueSendsTheNewestOnceToEachMember(t *testing.T) {
	c := &Cluster{stopping: true} // no worker starts: the test drains the queue
	m1, m2, m3 := &memberlist.Node{Name: "m1"}, &memberlist.Node{Name: "m2"}, &memberlist.Node{Name: "m3"}
	var q bigQueue
	q.put(c, "node/a", []byte("a-v1"), []*memberlist.Node{m1, m2, m3})
	q.put(c, "node/b", []byte("b-v1"), []*memberlist.Node{m1})
	q.put(c, "node/a", []byte("a-v2"), []*memberlist.Node{m1, m2, m3})
	if q.workers != 0 {
		t.Fatalf("%d workers counted, none started", q.workers)
	}
	q.workers = 1
	var got []string
	sent := map[string]int{}
	for {
		to, b, ok := q.next()
		if !ok {
			break
		}
		got = append(got, string(b)+">"+to.Name)
		sent[string(b)+">"+to.Name]++
	}
	want := []string{"a-v2>m3", "b-v1>m1", "a-v2>m2", "a-v2>m1"}
	if len(got) != len(want) {
		t.Fatalf("sends %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("sends %v, want %v", got, want)
		}
	}
	if q.workers != 0 || len(q.due) != 0 || len(q.names) != 0 {
		t.Errorf("queue not empty after draining: workers %d, due %v, names %v", q.workers, q.due, q.names)
	}

	// Two members ask for a's record (add), one of them twice, while it
	// is on its way to m1: each gets the newest bytes once.
	q.put(c, "node/a", []byte("a-v3"), []*memberlist.Node{m1})
	q.add(c, "node/a", []byte("a-v3"), m2)
	q.add(c, "node/a", []byte("a-v4"), m2)
	q.add(c, "node/a", []byte("a-v4"), m3)
	q.workers = 1
	got = nil
	for {
		to, b, ok := q.next()
		if !ok {
			break
		}
		got = append(got, string(b)+">"+to.Name)
	}
	if want := []string{"a-v4>m3", "a-v4>m2", "a-v4>m1"}; !slices.Equal(got, want) {
		t.Errorf("sends %v, want %v", got, want)
	}
}

// A request for a record that goes unanswered is asked again in the same
// bytes; the owner must not drop it as a copy of one already taken.
func TestARepeatedWantIsNotDroppedAsACopy(t *testing.T) {
	a := startNode(t, "a", 0, "", nil)
	b, err := encode(message{From: "peer", Wants: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	d := &delegate{c: a.Cluster}
	d.NotifyMsg(b)
	if a.seen.has(a.seen.digest(b)) {
		t.Error("a request for a's record was remembered: asked again, it would be dropped")
	}
}

// A record that changes faster than its fan-out reaches everyone still
// reaches everyone: the members the older bytes had not reached are served
// first with the newer.
func TestBigQueueServesTheMembersLeftBehindFirst(t *testing.T) {
	c := &Cluster{stopping: true}
	var members []*memberlist.Node
	for i := range 6 {
		members = append(members, &memberlist.Node{Name: fmt.Sprintf("m%d", i)})
	}
	var q bigQueue
	got := map[string]bool{}
	for v := range 6 {
		// Each version reaches two members before the next replaces it.
		q.put(c, "node/a", []byte(fmt.Sprintf("v%d", v)), members)
		q.workers = 1
		for range 2 {
			to, _, ok := q.next()
			if !ok {
				t.Fatal("queue empty early")
			}
			got[to.Name] = true
		}
	}
	if len(got) != len(members) {
		t.Errorf("six versions, two sends each, reached %d of %d members: %v", len(got), len(members), got)
	}
}
