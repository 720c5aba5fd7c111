// Command fakeimg is the fake engine with the argv of `llmgw engine fake`,
// for the containerd integration test's image while cmd/llmgw has no
// `engine fake` command (or cannot be built without cgo). The profile
// "fake" runs it unchanged as /llmgw.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/llmgw/llmgw/supervisor/fakeengine"
)

func main() {
	if len(os.Args) < 3 || os.Args[1] != "engine" || os.Args[2] != "fake" {
		fmt.Fprintln(os.Stderr, "usage: fakeimg engine fake --model NAME --port P [--host H] [--startup-delay D] [--crash-after D] [--exit-code N] [--fail-health] [--legacy-kv-metric]")
		os.Exit(2)
	}
	var cfg fakeengine.Config
	fs := flag.NewFlagSet("engine fake", flag.ExitOnError)
	fs.StringVar(&cfg.Model, "model", "", "served model name")
	fs.IntVar(&cfg.Port, "port", 8000, "HTTP port")
	fs.StringVar(&cfg.Host, "host", "", "address to bind (all when empty)")
	fs.DurationVar(&cfg.StartupDelay, "startup-delay", 0, "503 on /health for this long")
	fs.DurationVar(&cfg.CrashAfter, "crash-after", 0, "exit with --exit-code after this long")
	fs.IntVar(&cfg.ExitCode, "exit-code", 1, "exit code of the scripted crash")
	fs.BoolVar(&cfg.FailHealth, "fail-health", false, "never report healthy")
	fs.BoolVar(&cfg.LegacyKVMetric, "legacy-kv-metric", false, "export vllm:gpu_cache_usage_perc")
	_ = fs.Parse(os.Args[3:])
	cfg.Log = os.Stderr

	// As PID 1 of a container the process gets no default signal handling:
	// without this, SIGTERM would be ignored and every stop would wait for
	// SIGKILL.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := fakeengine.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(fakeengine.ExitCode(err))
}
