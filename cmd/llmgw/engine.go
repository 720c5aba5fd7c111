package main

import (
	"context"
	"os"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/supervisor/fakeengine"
)

// engineCommand holds engines built into the binary. It is hidden: users
// reach the fake engine through `llmgw place --engine fake`.
func engineCommand() *cli.Command {
	return &cli.Command{
		Name:   "engine",
		Hidden: true,
		Usage:  "engines built into llmgw",
		Commands: []*cli.Command{{
			Name:  "fake",
			Usage: "a fake inference engine speaking vLLM's HTTP surface (no GPU needed)",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "model", Required: true, Usage: "served model name"},
				&cli.IntFlag{Name: "port", Value: 8000},
				&cli.StringFlag{Name: "host", Value: "0.0.0.0"},
				&cli.DurationFlag{Name: "startup-delay", Usage: "answer 503 on /health for this long, like loading weights"},
				&cli.DurationFlag{Name: "crash-after", Usage: "exit abruptly after this long"},
				&cli.IntFlag{Name: "exit-code", Value: 1, Usage: "exit code of --crash-after"},
				&cli.BoolFlag{Name: "fail-health", Usage: "always answer 503 on /health"},
				&cli.BoolFlag{Name: "legacy-kv-metric", Usage: "export vllm:gpu_cache_usage_perc (vLLM before 0.10)"},
				// The engine model (see package fakeengine); vLLM's names
				// where vLLM has the knob.
				&cli.DurationFlag{Name: "token-delay", Usage: "time per generated token after the first"},
				&cli.DurationFlag{Name: "prefill-base", Usage: "fixed part of the time to first token"},
				&cli.DurationFlag{Name: "prefill-per-1k-tokens", Usage: "time to first token per 1000 prompt tokens not in the prefix cache"},
				&cli.IntFlag{Name: "max-num-seqs", Value: 256, Usage: "sequences run at once; the rest queue"},
				&cli.IntFlag{Name: "block-size", Value: 16, Usage: "tokens per KV-cache block"},
				&cli.IntFlag{Name: "num-gpu-blocks-override", Value: 8192, Usage: "KV-cache size in blocks (bounds the tokens in flight and the prefix cache)"},
				&cli.BoolFlag{Name: "no-enable-prefix-caching", Usage: "compute every prompt whole"},
				// The engine runner passes the engine's key in VLLM_API_KEY,
				// as it does vLLM's (off the command line, which every local
				// user can read); the flag wins, as vLLM's does.
				&cli.StringFlag{Name: "api-key", Sources: cli.EnvVars("VLLM_API_KEY"), Usage: "demand this key as a bearer token on /v1/* (401 without it), as vLLM's --api-key; /health and /metrics stay open"},
				// Gang mode, with vLLM's multi-node flags (see fakeengine.Gang).
				&cli.IntFlag{Name: "nnodes", Value: 1, Usage: "nodes of the gang; above 1, rank 0 listens on the master port and the others connect"},
				&cli.IntFlag{Name: "node-rank", Usage: "this member's rank in the gang"},
				&cli.StringFlag{Name: "master-addr", Usage: "rank 0's rendezvous address"},
				&cli.IntFlag{Name: "master-port", Usage: "rank 0's rendezvous port"},
				&cli.BoolFlag{Name: "headless", Usage: "serve no HTTP (every rank above 0)"},
				&cli.BoolFlag{Name: "hang-on-peer-loss", Usage: "keep running when a gang peer is lost, as vLLM's ranks hang (only llmgw's gang teardown stops it)"},
			},
			Action: func(ctx context.Context, c *cli.Command) error {
				g := &fakeengine.Gang{NNodes: int(c.Int("nnodes")), NodeRank: int(c.Int("node-rank")),
					MasterAddr: c.String("master-addr"), MasterPort: int(c.Int("master-port")), HangOnPeerLoss: c.Bool("hang-on-peer-loss")}
				err := fakeengine.RunMaybeGang(ctx, fakeengine.Config{
					Model: c.String("model"), Port: int(c.Int("port")), Host: c.String("host"),
					StartupDelay: c.Duration("startup-delay"), CrashAfter: c.Duration("crash-after"),
					ExitCode: int(c.Int("exit-code")), FailHealth: c.Bool("fail-health"),
					LegacyKVMetric: c.Bool("legacy-kv-metric"), TokenDelay: c.Duration("token-delay"), APIKey: c.String("api-key"),
					PrefillBase: c.Duration("prefill-base"), PrefillPer1KTokens: c.Duration("prefill-per-1k-tokens"),
					MaxRunning: int(c.Int("max-num-seqs")), BlockSize: int(c.Int("block-size")),
					KVCacheBlocks: int(c.Int("num-gpu-blocks-override")), NoPrefixCaching: c.Bool("no-enable-prefix-caching"),
					Log: os.Stderr, Now: time.Now,
				}, g)
				if code := fakeengine.ExitCode(err); code != 0 {
					return codedError{msg: err.Error(), code: code}
				}
				return nil
			},
		}},
	}
}
