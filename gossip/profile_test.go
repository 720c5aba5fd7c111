package gossip

import (
	"testing"
	"time"
)

// PushPullEvery follows memberlist's stretching of the interval past 32
// nodes (pushPullScale), which the scale harness uses to cost push/pull.
func TestPushPullEveryStretchesPast32Nodes(t *testing.T) {
	lan, err := ProfileByName("lan")
	if err != nil {
		t.Fatal(err)
	}
	for n, want := range map[int]time.Duration{8: 30 * time.Second, 32: 30 * time.Second, 33: 60 * time.Second,
		64: 60 * time.Second, 65: 90 * time.Second, 500: 150 * time.Second} {
		if got := lan.PushPullEvery(n); got != want {
			t.Errorf("%d nodes: every %v, want %v", n, got, want)
		}
	}
}
