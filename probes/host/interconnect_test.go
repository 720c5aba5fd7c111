package host

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"testing/fstest"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
)

func port(fsys fstest.MapFS, dev, n, state, layer string, tx, rx uint64) {
	p := "sys/class/infiniband/" + dev + "/ports/" + n + "/"
	fsys[p+"state"] = &fstest.MapFile{Data: []byte(state + "\n")}
	fsys[p+"link_layer"] = &fstest.MapFile{Data: []byte(layer + "\n")}
	fsys[p+"counters/port_xmit_data"] = &fstest.MapFile{Data: []byte(strconv.FormatUint(tx, 10) + "\n")}
	fsys[p+"counters/port_rcv_data"] = &fstest.MapFile{Data: []byte(strconv.FormatUint(rx, 10) + "\n")}
}

// Two reads a (simulated) second apart: the counters are 4-byte words, so
// 250,000 words is 1 MB. A port with no link reads as such, and a reset
// counter is a warning, not a rate.
func TestReadInterconnect(t *testing.T) {
	fsys := fstest.MapFS{}
	port(fsys, "mlx5_0", "1", "4: ACTIVE", "Ethernet", 1_000_000, 5_000_000)
	port(fsys, "mlx5_1", "1", "1: DOWN", "Ethernet", 7, 7)
	port(fsys, "mlx5_2", "1", "4: ACTIVE", "InfiniBand", 900, 900)
	// The test's Sleep moves the clock, so no test waits a second.
	clk := clock.NewFake(time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC))
	var slept time.Duration
	sleep := func(_ context.Context, d time.Duration) error {
		slept += d
		// 1.25 s pass while the links carry traffic.
		clk.Advance(1250 * time.Millisecond)
		port(fsys, "mlx5_0", "1", "4: ACTIVE", "Ethernet", 1_000_000+250_000*125/100*10, 5_000_000+250_000*125/100)
		port(fsys, "mlx5_2", "1", "4: ACTIVE", "InfiniBand", 100, 900) // reset
		return nil
	}
	got, err := ReadInterconnect(context.Background(), Config{Root: fsys, Clock: clk, Sleep: sleep}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if slept != time.Second || got.Interval != 1250*time.Millisecond {
		t.Errorf("slept %v, interval %v", slept, got.Interval)
	}
	if len(got.Links) != 2 {
		t.Fatalf("links = %+v", got.Links)
	}
	a, b := got.Links[0], got.Links[1]
	if a.Device != "mlx5_0" || a.Port != 1 || !a.Up || a.State != "ACTIVE" || a.LinkLayer != "Ethernet" || a.TxMBps != 10 || a.RxMBps != 1 {
		t.Errorf("mlx5_0 = %+v, want 10 MB/s out, 1 MB/s in", a)
	}
	if b.Device != "mlx5_1" || b.Up || b.State != "DOWN" || b.TxMBps != 0 || b.RxMBps != 0 {
		t.Errorf("mlx5_1 = %+v, want down with no traffic", b)
	}
	if len(got.Warnings) != 1 || got.Warnings[0] != "mlx5_2/1: counters went backwards (reset); rates at the next read" {
		t.Errorf("warnings = %q", got.Warnings)
	}
}

// No RDMA devices: nothing, no error, and no wait.
func TestReadInterconnectNone(t *testing.T) {
	sleep := func(context.Context, time.Duration) error { t.Error("slept without devices"); return nil }
	got, err := ReadInterconnect(context.Background(), Config{Root: fstest.MapFS{}, Sleep: sleep}, 0)
	if err != nil || len(got.Links) != 0 || len(got.Warnings) != 0 {
		t.Errorf("got %+v, %v", got, err)
	}
}

// A cancelled wait is the caller's error.
func TestReadInterconnectCancelled(t *testing.T) {
	fsys := fstest.MapFS{}
	port(fsys, "mlx5_0", "1", "4: ACTIVE", "Ethernet", 1, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ReadInterconnect(ctx, Config{Root: fsys}, 0); err == nil {
		t.Error("no error after cancel")
	}
}

// RDMADevices names each device with a port up, once, from one read.
func TestRDMADevices(t *testing.T) {
	fsys := fstest.MapFS{}
	port(fsys, "mlx5_0", "1", "4: ACTIVE", "InfiniBand", 1, 1)
	port(fsys, "mlx5_0", "2", "4: ACTIVE", "InfiniBand", 1, 1)
	port(fsys, "mlx5_1", "1", "1: DOWN", "InfiniBand", 1, 1)
	port(fsys, "mlx5_2", "1", "4: ACTIVE", "Ethernet", 1, 1)
	if got := RDMADevices(Config{Root: fsys}); !slices.Equal(got, []string{"mlx5_0", "mlx5_2"}) {
		t.Errorf("RDMADevices = %q, want mlx5_0 and mlx5_2 (mlx5_1 is down)", got)
	}
	if got := RDMADevices(Config{Root: fstest.MapFS{}}); len(got) != 0 {
		t.Errorf("no devices: %q", got)
	}
}
