package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/llmgw/llmgw/supervisor/fakeengine"
)

// engineCommand holds engines built into the binary. It is hidden: users
// reach the fake engine through `llmgw place --engine fake`.
func engineCommand() *cli.Command {
	return &cli.Command{
		Name:     "engine",
		Hidden:   true,
		Usage:    "engines built into llmgw",
		Commands: []*cli.Command{fakeCommand()},
	}
}

// fakeDescription is the fake engine's help beyond its flags: the two
// ways to call it.
const fakeDescription = `Without --personality, the fake speaks vLLM's HTTP surface and takes the
flags below.

With --personality (first, before anything else), it behaves like that
real engine where llmgw can tell (loading, the cost of /health, metric
names, which paths the key guards) and the rest of the command line is the
real engine's, as llmgw's profiles render it:

  llmgw engine fake --personality vllm serve MODEL --served-model-name X \
      --tensor-parallel-size N --host H --port P [--max-num-seqs=N ...]
  llmgw engine fake --personality sglang -m sglang.launch_server \
      --model-path M --served-model-name X --tp-size N --host H --port P \
      --enable-metrics [--api-key=K ...]
  llmgw engine fake --personality llamacpp --model M --alias X --host H \
      --port P --n-gpu-layers 999 --metrics

A flag the real engine does not have is refused (exit status 2); the
accepted flags are listed in supervisor/fakeengine/testdata/flags-*.txt.
Keys come as the real engines take them: VLLM_API_KEY or --api-key (vllm),
--api-key (sglang), LLAMA_API_KEY or --api-key (llamacpp). What only the
fake has comes from the environment: FAKE_ENGINE_STARTUP_DELAY,
FAKE_ENGINE_TOKEN_DELAY, FAKE_ENGINE_PREFILL_BASE,
FAKE_ENGINE_PREFILL_PER_1K_TOKENS, FAKE_ENGINE_HEALTH_DELAY_PER_RUNNING
(vllm; 500ms per running request), FAKE_ENGINE_HANG_AFTER,
FAKE_ENGINE_CRASH_AFTER, FAKE_ENGINE_EXIT_CODE, FAKE_ENGINE_STEP_INTERFERENCE;
sglang also reads SGLANG_HEALTH_CHECK_TIMEOUT and
SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION.

Prefill/decode disaggregation, as the real engines take it: vllm (and the
plain fake) --kv-transfer-config '{"kv_connector":"NixlConnector",
"kv_role":"kv_both","kv_load_failure_policy":"fail"}' with
VLLM_NIXL_SIDE_CHANNEL_HOST, VLLM_NIXL_SIDE_CHANNEL_PORT and
VLLM_NIXL_ABORT_REQUEST_TIMEOUT; sglang --disaggregation-mode
prefill|decode, --disaggregation-transfer-backend mooncake|nixl,
--disaggregation-bootstrap-port with SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT
and SGLANG_DISAGGREGATION_WAITING_TIMEOUT. The fake's own knobs:
FAKE_ENGINE_KV_TRANSFER_PER_1K_TOKENS (5ms), FAKE_ENGINE_KV_COMPAT_VERSION
(engines that differ refuse each other's KV) and
FAKE_ENGINE_KV_TRANSFER_FAIL.

Every form serves POST /debug/hang (with the engine's key as a bearer
token when it has one): from then on nothing answers and the token
counters stop, while the process stays up.`

// fakeCommand is `llmgw engine fake`. Its flags are parsed by plainFake
// or, after --personality, by the real engine's own rules
// (fakeengine.ParseCommandLine), which urfave/cli cannot do: `-m`, `serve`
// and --alias are no flags of ours. Hence it takes its arguments unparsed.
func fakeCommand() *cli.Command {
	return &cli.Command{
		Name:            "fake",
		Usage:           "a fake inference engine speaking vLLM's HTTP surface, or with --personality vLLM's, SGLang's or llama.cpp's (no GPU needed)",
		Description:     fakeDescription,
		SkipFlagParsing: true,
		Action: func(ctx context.Context, c *cli.Command) error {
			args := c.Args().Slice()
			p, rest, ok, err := fakeengine.PersonalityArgs(args)
			if err != nil {
				return usageError(err.Error())
			}
			if !ok {
				return runPlainFake(ctx, c, args)
			}
			cfg, g, err := fakeengine.ParseCommandLine(p, rest, os.Getenv)
			if err != nil {
				return usageError(err.Error())
			}
			cfg.Log, cfg.Now = os.Stderr, time.Now
			return fakeExit(fakeengine.RunMaybeGang(ctx, cfg, g))
		},
	}
}

// fakeExit maps the engine's end to the process's exit status.
func fakeExit(err error) error {
	if code := fakeengine.ExitCode(err); code != 0 {
		return codedError{msg: err.Error(), code: code}
	}
	return nil
}

// runPlainFake parses args with the plain fake's flags, as a command of its
// own (the help shows them), and runs it. It is a root of its own, so it
// gets what newApp gives the tree: urfave/cli's parse errors are usage
// errors (exit status 2), and urfave/cli never exits the process itself.
func runPlainFake(ctx context.Context, parent *cli.Command, args []string) error {
	plain := plainFake()
	plain.Name = "llmgw engine fake"
	plain.Writer, plain.ErrWriter = parent.Root().Writer, parent.Root().ErrWriter
	plain.ExitErrHandler = func(context.Context, *cli.Command, error) {}
	configure(plain)
	// A context that carries no command, so plain runs as a root, not as
	// a child of `fake` (its help would read `fake fake`); it ends with
	// ctx.
	pctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	defer stop()
	return plain.Run(pctx, append([]string{plain.Name}, args...))
}

// plainFake is the fake engine without a personality.
func plainFake() *cli.Command {
	return &cli.Command{
		Usage:       "a fake inference engine speaking vLLM's HTTP surface (no GPU needed)",
		Description: fakeDescription,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "model", Required: true, Usage: "served model name"},
			&cli.IntFlag{Name: "port", Value: 8000},
			&cli.StringFlag{Name: "host", Value: "0.0.0.0"},
			&cli.DurationFlag{Name: "startup-delay", Usage: "answer 503 on /health for this long, like loading weights"},
			&cli.DurationFlag{Name: "crash-after", Usage: "exit abruptly after this long"},
			&cli.IntFlag{Name: "exit-code", Value: 1, Usage: "exit code of --crash-after"},
			&cli.BoolFlag{Name: "fail-health", Usage: "always answer 503 on /health"},
			&cli.BoolFlag{Name: "legacy-kv-metric", Usage: "export vllm:gpu_cache_usage_perc (vLLM before 0.10)"},
			&cli.DurationFlag{Name: "hang-after", Sources: cli.EnvVars(fakeengine.EnvHangAfter),
				Usage: "hang after this long: every request blocks without a byte and the counters stop, while the process stays up (also POST /debug/hang)"},
			// The engine model (see package fakeengine); vLLM's names
			// where vLLM has the knob.
			&cli.DurationFlag{Name: "token-delay", Usage: "time per generated token after the first"},
			&cli.DurationFlag{Name: "prefill-base", Usage: "fixed part of the time to first token"},
			&cli.DurationFlag{Name: "prefill-per-1k-tokens", Usage: "time to first token per 1000 prompt tokens not in the prefix cache"},
			&cli.IntFlag{Name: "max-num-seqs", Value: 256, Usage: "sequences run at once; the rest queue"},
			&cli.IntFlag{Name: "block-size", Value: 16, Usage: "tokens per KV-cache block"},
			&cli.IntFlag{Name: "num-gpu-blocks-override", Value: 8192, Usage: "KV-cache size in blocks (bounds the tokens in flight and the prefix cache)"},
			&cli.BoolFlag{Name: "no-enable-prefix-caching", Usage: "compute every prompt whole"},
			// LoRA with vLLM's flags; the runtime endpoints with vLLM's
			// variable (VLLM_ALLOW_RUNTIME_LORA_UPDATING).
			&cli.BoolFlag{Name: "enable-lora", Usage: "serve LoRA adapters, as vLLM's --enable-lora"},
			&cli.IntFlag{Name: "max-loras", Usage: "distinct adapters running at once (default 1); the others wait"},
			&cli.IntFlag{Name: "max-lora-rank", Usage: "largest adapter rank accepted (default 16)"},
			&cli.IntFlag{Name: "max-cpu-loras", Usage: "vLLM's CPU cache of adapters (checked: at least --max-loras)"},
			&cli.StringSliceFlag{Name: "lora-modules", Usage: "adapter NAME=PATH loaded at start (repeatable)"},
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
			// Prefill/decode disaggregation with vLLM's flag and
			// variables (VLLM_NIXL_SIDE_CHANNEL_HOST, _PORT,
			// VLLM_NIXL_ABORT_REQUEST_TIMEOUT; see fakeengine.KVTransfer).
			&cli.StringFlag{Name: "kv-transfer-config", Usage: `vLLM's JSON, e.g. '{"kv_connector":"NixlConnector","kv_role":"kv_both"}': serve prefill legs and decode from a prefill's side channel`},
			&cli.BoolFlag{Name: "step-interference", Sources: cli.EnvVars(fakeengine.EnvStepInterference),
				Usage: "a prefill of T tokens delays every running decode by T × the per-token prefill time (off: sequences do not slow each other)"},
			&cli.BoolFlag{Name: "hang-on-peer-loss", Usage: "keep running when a gang peer is lost, as vLLM's ranks hang (only llmgw's gang teardown stops it)"},
			// Only to say where it belongs: first.
			&cli.StringFlag{Name: "personality", Usage: "vllm, sglang or llamacpp: must come first (see above)",
				Action: func(context.Context, *cli.Command, string) error {
					return usageError("--personality must come first: everything after it is the real engine's command line")
				}},
		},
		Action: func(ctx context.Context, c *cli.Command) error {
			var modules []fakeengine.LoRAModule
			for _, v := range c.StringSlice("lora-modules") {
				lm, err := fakeengine.ParseLoRAModule(v)
				if err != nil {
					return usageError(fmt.Sprintf("--lora-modules %q: %v", v, err))
				}
				modules = append(modules, lm)
			}
			var kv fakeengine.KVTransfer
			if v := c.String("kv-transfer-config"); v != "" {
				if err := fakeengine.ParseVLLMKVTransferConfig(v, &kv); err != nil {
					return usageError(err.Error())
				}
			}
			g := &fakeengine.Gang{NNodes: int(c.Int("nnodes")), NodeRank: int(c.Int("node-rank")),
				MasterAddr: c.String("master-addr"), MasterPort: int(c.Int("master-port")), HangOnPeerLoss: c.Bool("hang-on-peer-loss")}
			cfg := fakeengine.Config{
				Model: c.String("model"), Port: int(c.Int("port")), Host: c.String("host"),
				StartupDelay: c.Duration("startup-delay"), CrashAfter: c.Duration("crash-after"),
				ExitCode: int(c.Int("exit-code")), FailHealth: c.Bool("fail-health"),
				LegacyKVMetric: c.Bool("legacy-kv-metric"), TokenDelay: c.Duration("token-delay"), APIKey: c.String("api-key"),
				PrefillBase: c.Duration("prefill-base"), PrefillPer1KTokens: c.Duration("prefill-per-1k-tokens"),
				MaxRunning: int(c.Int("max-num-seqs")), BlockSize: int(c.Int("block-size")),
				KVCacheBlocks: int(c.Int("num-gpu-blocks-override")), NoPrefixCaching: c.Bool("no-enable-prefix-caching"),
				HangAfter:  c.Duration("hang-after"),
				EnableLoRA: c.Bool("enable-lora"), MaxLoRAs: int(c.Int("max-loras")), MaxLoRARank: int(c.Int("max-lora-rank")),
				MaxCPULoRAs: int(c.Int("max-cpu-loras")), LoRAModules: modules,
				RuntimeLoRA:   fakeengine.EnvTrue(os.Getenv(fakeengine.EnvVLLMRuntimeLoRA)),
				LoRAInfoSplit: fakeengine.EnvTrue(os.Getenv(fakeengine.EnvLoRAInfoSplit)),
				KV:            kv, StepInterference: c.Bool("step-interference"),
				Log: os.Stderr, Now: time.Now,
			}
			if err := fakeengine.KVEnv(&cfg, os.Getenv); err != nil {
				return usageError(err.Error())
			}
			return fakeExit(fakeengine.RunMaybeGang(ctx, cfg, g))
		},
	}
}
