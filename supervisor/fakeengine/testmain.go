package fakeengine

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"time"
)

// MainForTests lets a test binary stand in for `llmgw engine fake`: the
// fake profile runs `<self> engine fake --model M --port P ...`, and tests
// of the engine runner point Self at their own binary. Given the binary's
// arguments, it runs the engine and returns its exit code with true when
// they ask for the fake engine, and returns false at once otherwise. As the
// CLI, `engine fake --personality P ARGS...` reads ARGS as P's real
// command line (ParseCommandLine).
func MainForTests(args []string) (int, bool) {
	if len(args) < 2 || args[0] != "engine" || args[1] != "fake" {
		return 0, false
	}
	if p, rest, ok, err := PersonalityArgs(args[2:]); ok || err != nil {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2, true
		}
		cfg, g, err := ParseCommandLine(p, rest, os.Getenv)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2, true
		}
		cfg.Log = os.Stderr
		return ExitCode(RunMaybeGang(context.Background(), cfg, g)), true
	}
	fs := flag.NewFlagSet("fake", flag.ExitOnError)
	model := fs.String("model", "", "")
	port := fs.Int("port", 0, "")
	host := fs.String("host", "", "")
	crash := fs.Duration("crash-after", 0, "")
	code := fs.Int("exit-code", 1, "")
	failHealth := fs.Bool("fail-health", false, "")
	// As `llmgw engine fake`: the runner passes the key in VLLM_API_KEY.
	apiKey := fs.String("api-key", os.Getenv("VLLM_API_KEY"), "")
	var m Config
	fs.DurationVar(&m.TokenDelay, "token-delay", 0, "")
	fs.DurationVar(&m.PrefillBase, "prefill-base", 0, "")
	fs.DurationVar(&m.PrefillPer1KTokens, "prefill-per-1k-tokens", 0, "")
	fs.IntVar(&m.MaxRunning, "max-num-seqs", 0, "")
	fs.IntVar(&m.BlockSize, "block-size", 0, "")
	fs.IntVar(&m.KVCacheBlocks, "num-gpu-blocks-override", 0, "")
	fs.BoolVar(&m.NoPrefixCaching, "no-enable-prefix-caching", false, "")
	// LoRA, with vLLM's flag names; the runtime endpoints with vLLM's
	// variable. --lora-modules may be given more than once.
	fs.BoolVar(&m.EnableLoRA, "enable-lora", false, "")
	fs.IntVar(&m.MaxLoRAs, "max-loras", 0, "")
	fs.IntVar(&m.MaxLoRARank, "max-lora-rank", 0, "")
	fs.IntVar(&m.MaxCPULoRAs, "max-cpu-loras", 0, "")
	fs.Func("lora-modules", "", func(v string) error {
		lm, err := ParseLoRAModule(v)
		m.LoRAModules = append(m.LoRAModules, lm)
		return err
	})
	m.RuntimeLoRA = EnvTrue(os.Getenv(EnvVLLMRuntimeLoRA))
	m.LoRAInfoSplit, _ = envBool(cmp.Or(os.Getenv(EnvLoRAInfoSplit), "0"))
	// Disaggregation, as `llmgw engine fake` takes it.
	kvConfig := fs.String("kv-transfer-config", "", "")
	fs.BoolVar(&m.StepInterference, "step-interference", false, "")
	hang := os.Getenv(EnvHangAfter)
	fs.Func("hang-after", "", func(v string) error { hang = v; return nil })
	g := gangFlags(fs)
	_ = fs.Parse(args[2:])
	if hang != "" {
		d, err := time.ParseDuration(hang)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fake engine: --hang-after (or %s) %q: want a duration\n", EnvHangAfter, hang)
			return 2, true
		}
		m.HangAfter = d
	}
	if *kvConfig != "" {
		if err := ParseVLLMKVTransferConfig(*kvConfig, &m.KV); err != nil {
			fmt.Fprintf(os.Stderr, "fake engine: %v\n", err)
			return 2, true
		}
	}
	if err := KVEnv(&m, os.Getenv); err != nil {
		fmt.Fprintf(os.Stderr, "fake engine: %v\n", err)
		return 2, true
	}
	m.Model, m.Port, m.Host, m.CrashAfter, m.ExitCode, m.FailHealth, m.APIKey = *model, *port, *host, *crash, *code, *failHealth, *apiKey
	err := RunMaybeGang(context.Background(), m, g)
	return ExitCode(err), true
}
