package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/llmgw/llmgw/internal/clock"
	"github.com/llmgw/llmgw/supervisor/datadir"
)

// aliveEvery is how often the agent refreshes its last-alive stamp: the
// overview says "does not answer since" to within this.
const aliveEvery = 3 * time.Second

// keepAlive writes the agent's stamp (datadir.Alive) now and every
// aliveEvery until ctx ends, then returns. A failed write is logged once
// until one succeeds again: the stamp is for viewers, the node serves on
// without it.
func keepAlive(ctx context.Context, dir datadir.Dir, a datadir.Alive, clk clock.Clock, every time.Duration, log *slog.Logger) {
	failing := false
	for {
		a.At = clk.Now()
		if err := dir.WriteAlive(a); err != nil {
			if !failing {
				log.Warn("cannot write the last-alive stamp; llmgw overview will not say since when the agent is silent", "err", err)
			}
			failing = true
		} else {
			failing = false
		}
		if !clock.Sleep(ctx, clk, every) {
			return
		}
	}
}

// localAddr is where a viewer on this machine dials a listener bound to
// addr: a wildcard host is reached on loopback.
func localAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if ip != nil && ip.To4() == nil {
			host = "::1"
		} else {
			host = "127.0.0.1"
		}
	}
	return net.JoinHostPort(host, port)
}

// aliveStamp is what this agent says of itself in agent.json.
func aliveStamp(name, api, logFile, weights, simulated string, started time.Time) datadir.Alive {
	if weights != "" {
		if abs, err := filepath.Abs(weights); err == nil {
			weights = abs
		} else {
			weights = ""
		}
	}
	return datadir.Alive{StartedAt: started, PID: os.Getpid(), Name: name, Version: version, API: localAddr(api),
		LogFile: logFile, WeightsDir: weights, SimulatedGPUs: simulated}
}
