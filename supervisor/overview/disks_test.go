package overview

import (
	"context"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/supervisor/datadir"
)

// A hung statfs is cut off by the reader's clock: on a fake one the bound
// passes when the clock is moved, and the disk then says it does not
// answer.
func TestDisksBoundIsOnTheReadersClock(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	clk := clock.NewFake(t0)
	r := DisksReader{Clock: clk, Statfs: func(string) (uint64, uint64, error) { <-release; return 0, 0, nil }}
	done := make(chan DisksSection, 1)
	go func() { done <- r.Read(datadir.New("/var/lib/llmgw"), stamp{}, time.Hour) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("the bound is not on the reader's clock: %v", err)
	}
	clk.Advance(time.Hour)
	select {
	case s := <-done:
		if len(s.Disks) != 1 || s.Disks[0].Err != errNoAnswer.Error() {
			t.Errorf("disks = %+v, want the data dir not answering", s.Disks)
		}
	case <-ctx.Done():
		t.Fatal("Read did not return once the bound passed on its clock")
	}
}
