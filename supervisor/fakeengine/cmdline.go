package fakeengine

import (
	_ "embed"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The flags each real engine's parser accepts: data taken from the
// engine's own source, named in each file's header. They live in testdata
// so that tests read the same lists.
var (
	//go:embed testdata/flags-vllm.txt
	flagsVLLM string
	//go:embed testdata/flags-sglang.txt
	flagsSGLang string
	//go:embed testdata/flags-llamacpp.txt
	flagsLlamaCpp string
)

// The fake-only knobs a personality reads from the environment (a
// deployment's env reaches them); a real engine's flag set must not grow.
const (
	EnvStartupDelay          = "FAKE_ENGINE_STARTUP_DELAY"
	EnvTokenDelay            = "FAKE_ENGINE_TOKEN_DELAY"
	EnvPrefillBase           = "FAKE_ENGINE_PREFILL_BASE"
	EnvPrefillPer1KTokens    = "FAKE_ENGINE_PREFILL_PER_1K_TOKENS"
	EnvHealthDelayPerRunning = "FAKE_ENGINE_HEALTH_DELAY_PER_RUNNING"
	EnvHangAfter             = "FAKE_ENGINE_HANG_AFTER"
	EnvCrashAfter            = "FAKE_ENGINE_CRASH_AFTER"
	EnvExitCode              = "FAKE_ENGINE_EXIT_CODE"
	// EnvLoRAInfoSplit (true or 1) gives vllm:lora_requests_info the
	// labels of older vLLM releases (Config.LoRAInfoSplit).
	EnvLoRAInfoSplit = "FAKE_ENGINE_LORA_INFO_SPLIT"
)

// argKind is what follows a flag on the command line.
type argKind string

const (
	argNone  argKind = "none"
	argValue argKind = "value"
	argList  argKind = "list"
)

// flagSpec is one line of a flags file.
type flagSpec struct {
	names []string
	arg   argKind
}

// flagTable is one engine's accepted flags, by every name.
type flagTable struct {
	// program is how the engine is called, for messages.
	program string
	file    string
	byName  map[string]*flagSpec
}

// parseFlagTable reads a flags file: comment lines start with #, every
// other line is a flag's names then its argKind.
func parseFlagTable(program, file, data string) (*flagTable, error) {
	t := &flagTable{program: program, file: file, byName: map[string]*flagSpec{}}
	for i, line := range strings.Split(data, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		spec := &flagSpec{names: f[:len(f)-1], arg: argKind(f[len(f)-1])}
		if len(spec.names) == 0 || (spec.arg != argNone && spec.arg != argValue && spec.arg != argList) {
			return nil, fmt.Errorf("%s:%d: %q: want the flag's names, then none, value or list", file, i+1, line)
		}
		for _, n := range spec.names {
			if !strings.HasPrefix(n, "-") || t.byName[n] != nil {
				return nil, fmt.Errorf("%s:%d: %q is not a flag name, or is listed twice", file, i+1, n)
			}
			t.byName[n] = spec
		}
	}
	return t, nil
}

// flagTableFor is p's table, read afresh: the files are small, and a table
// built once would be state shared by every caller.
func flagTableFor(p Personality) (*flagTable, error) {
	switch p {
	case PersonalityVLLM:
		return parseFlagTable("vllm serve", "testdata/flags-vllm.txt", flagsVLLM)
	case PersonalitySGLang:
		return parseFlagTable("sglang.launch_server", "testdata/flags-sglang.txt", flagsSGLang)
	case PersonalityLlamaCpp:
		return parseFlagTable("llama-server", "testdata/flags-llamacpp.txt", flagsLlamaCpp)
	}
	return nil, fmt.Errorf("fake engine: personality %q has no command line", p)
}

// CommandLineError is a command line the real engine would refuse: exit
// status 2, as argparse's.
type CommandLineError struct {
	Personality Personality
	// Flag is the offending flag, when one is to blame.
	Flag string
	Msg  string
}

func (e *CommandLineError) Error() string {
	return fmt.Sprintf("fake engine (%s personality): %s", e.Personality, e.Msg)
}

// parsedArgs is a command line split into flags (by their first name, in
// order) and positional arguments.
type parsedArgs struct {
	flags      []parsedFlag
	positional []string
}

type parsedFlag struct {
	name   string // the spec's first name
	values []string
}

// last is the values of name's last occurrence.
func (a parsedArgs) last(name string) ([]string, bool) {
	for i := len(a.flags) - 1; i >= 0; i-- {
		if a.flags[i].name == name {
			return a.flags[i].values, true
		}
	}
	return nil, false
}

// lastOf is the first name of names given last, or "".
func (a parsedArgs) lastOf(names ...string) string {
	for i := len(a.flags) - 1; i >= 0; i-- {
		for _, n := range names {
			if a.flags[i].name == n {
				return n
			}
		}
	}
	return ""
}

func (a parsedArgs) str(name string) string {
	v, _ := a.last(name)
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func (a parsedArgs) has(name string) bool { _, ok := a.last(name); return ok }

// isFlag reports whether arg is written as a flag, not a value: a dash
// and more, and not a negative number (argparse's rule, which lets
// `-np -1` through).
func isFlag(arg string) bool {
	if len(arg) < 2 || arg[0] != '-' {
		return false
	}
	_, err := strconv.ParseFloat(arg, 64)
	return err != nil
}

// parse splits args by t. underscores lets --max_model_len stand for
// --max-model-len, as vLLM's FlexibleArgumentParser does.
func (t *flagTable) parse(p Personality, args []string, underscores bool) (parsedArgs, error) {
	var out parsedArgs
	fail := func(flag, format string, a ...any) error {
		return &CommandLineError{Personality: p, Flag: flag, Msg: fmt.Sprintf(format, a...)}
	}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			out.positional = append(out.positional, args[i+1:]...)
			break
		}
		if !isFlag(arg) {
			out.positional = append(out.positional, arg)
			continue
		}
		name, val, inline := strings.Cut(arg, "=")
		if underscores && strings.HasPrefix(name, "--") {
			name = "--" + strings.ReplaceAll(name[2:], "_", "-")
		}
		spec := t.byName[name]
		if spec == nil {
			return out, fail(name, "%s has no flag %s (the flags it accepts are in supervisor/fakeengine/%s)", t.program, name, t.file)
		}
		f := parsedFlag{name: spec.names[0]}
		switch spec.arg {
		case argNone:
			if inline {
				return out, fail(name, "%s: %s takes no value (got %q)", t.program, name, val)
			}
		case argValue:
			if !inline {
				if i+1 >= len(args) || strings.HasPrefix(args[i+1], "--") {
					return out, fail(name, "%s: %s needs a value", t.program, name)
				}
				i++
				val = args[i]
			}
			f.values = []string{val}
		case argList:
			if inline {
				f.values = []string{val}
				break
			}
			for i+1 < len(args) && !isFlag(args[i+1]) && args[i+1] != "--" {
				i++
				f.values = append(f.values, args[i])
			}
			if len(f.values) == 0 {
				return out, fail(name, "%s: %s needs at least one value", t.program, name)
			}
		}
		out.flags = append(out.flags, f)
	}
	return out, nil
}

// ParseCommandLine reads args, the real engine's command line after its
// program name, as llmgw's profiles render it, into a Config for
// personality p, and a Gang when the command line asks for a multi-node
// replica:
//
//	vllm:     serve MODEL --served-model-name X --tensor-parallel-size N --host H --port P [...]
//	sglang:   -m sglang.launch_server --model-path M --served-model-name X --tp-size N --host H --port P --enable-metrics [...]
//	llamacpp: --model M --alias X --host H --port P --n-gpu-layers 999 --metrics [...]
//
// Both --flag value and --flag=value are accepted; a flag the real engine
// does not have is a *CommandLineError naming it. The served name, host,
// port, key and batch size map onto the Config, with each engine's
// defaults; other accepted flags are read and ignored. getenv supplies the
// engine's own variables (VLLM_API_KEY; LLAMA_API_KEY;
// SGLANG_HEALTH_CHECK_TIMEOUT and SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION)
// and the fake's knobs (the FAKE_ENGINE_* constants).
func ParseCommandLine(p Personality, args []string, getenv func(string) string) (Config, *Gang, error) {
	t, err := flagTableFor(p)
	if err != nil {
		return Config{}, nil, err
	}
	fail := func(flag, format string, a ...any) (Config, *Gang, error) {
		return Config{}, nil, &CommandLineError{Personality: p, Flag: flag, Msg: fmt.Sprintf(format, a...)}
	}
	cfg := Config{Personality: p}
	var g *Gang
	var a parsedArgs
	switch p {
	case PersonalityVLLM:
		if len(args) == 0 || args[0] != "serve" {
			return fail("", "want the command line of `vllm serve`: serve [MODEL] [flags]")
		}
		if a, err = t.parse(p, args[1:], true); err != nil {
			return Config{}, nil, err
		}
		if len(a.positional) > 1 {
			return fail("", "vllm serve: unrecognized arguments: %s", strings.Join(a.positional[1:], " "))
		}
		// The positional model wins over --model, as in vLLM's serve.
		model := a.str("--model")
		if len(a.positional) == 1 {
			model = a.positional[0]
		}
		if model == "" {
			return fail("", "vllm serve: no model: give it after serve, or with --model")
		}
		cfg.Model, cfg.Port = model, 8000
		if names, ok := a.last("--served-model-name"); ok {
			// The first of several names is the one vLLM reports.
			cfg.Model = names[0]
		}
		// vLLM reads VLLM_API_KEY when --api-key is not given.
		cfg.APIKey = getenv("VLLM_API_KEY")
		if keys, ok := a.last("--api-key"); ok {
			cfg.APIKey = keys[0]
		}
		cfg.NoPrefixCaching = a.lastOf("--enable-prefix-caching", "--no-enable-prefix-caching") == "--no-enable-prefix-caching"
		if g, err = gangOf(p, a, "--nnodes", "--node-rank"); err != nil {
			return Config{}, nil, err
		}
		if g != nil {
			g.MasterAddr = a.str("--master-addr")
			if g.MasterPort, err = intFlag(p, a, "--master-port", 0); err != nil {
				return Config{}, nil, err
			}
		}
		for _, f := range []struct {
			flag string
			dst  *int
		}{{"--max-num-seqs", &cfg.MaxRunning}, {"--block-size", &cfg.BlockSize}, {"--num-gpu-blocks-override", &cfg.KVCacheBlocks}} {
			if *f.dst, err = intFlag(p, a, f.flag, 0); err != nil {
				return Config{}, nil, err
			}
		}
		if cfg.MaxModelLen, err = humanIntFlag(p, a, "--max-model-len"); err != nil {
			return Config{}, nil, err
		}
		if err := vllmLoRAArgs(&cfg, a, getenv); err != nil {
			return Config{}, nil, err
		}
		if v := a.str("--kv-transfer-config"); v != "" {
			if err := ParseVLLMKVTransferConfig(v, &cfg.KV); err != nil {
				return fail("--kv-transfer-config", "vllm serve: %v", err)
			}
		}
		if cfg.KV.nixl() {
			if cfg.KV.TPSize, err = intFlag(p, a, "--tensor-parallel-size", 1); err != nil {
				return Config{}, nil, err
			}
		}
	case PersonalitySGLang:
		rest := args
		// `python3 -m sglang.launch_server ...`: a wrapper passes python's
		// arguments through.
		if len(rest) > 0 && rest[0] == "-m" {
			if len(rest) < 2 || rest[1] != "sglang.launch_server" {
				return fail("-m", "want -m sglang.launch_server, got %q", strings.Join(rest[:min(2, len(rest))], " "))
			}
			rest = rest[2:]
		}
		if a, err = t.parse(p, rest, false); err != nil {
			return Config{}, nil, err
		}
		if file := a.str("--config"); file != "" {
			// SGLang merges a YAML config file's settings into its
			// arguments, the command line winning
			// (python/sglang/srt/server_args_config_parser.py): its
			// settings go first, so a flag given again wins.
			from, err := configArgs(file)
			if err != nil {
				return fail("--config", "sglang.launch_server: --config %s: %v", file, err)
			}
			if a, err = t.parse(p, append(from, rest...), false); err != nil {
				return Config{}, nil, err
			}
		}
		if len(a.positional) > 0 {
			return fail("", "sglang.launch_server: unrecognized arguments: %s", strings.Join(a.positional, " "))
		}
		if cfg.Model = a.str("--model-path"); cfg.Model == "" {
			return fail("--model-path", "sglang.launch_server: the following arguments are required: --model-path")
		}
		if n := a.str("--served-model-name"); n != "" {
			cfg.Model = n
		}
		cfg.Host, cfg.Port = "127.0.0.1", 30000
		// SGLang reads its key from no variable.
		cfg.APIKey = a.str("--api-key")
		cfg.NoMetrics = !a.has("--enable-metrics")
		cfg.NoPrefixCaching = a.has("--disable-radix-cache")
		if cfg.MaxRunning, err = intFlag(p, a, "--max-running-requests", 0); err != nil {
			return Config{}, nil, err
		}
		if cfg.MaxModelLen, err = humanIntFlag(p, a, "--context-length"); err != nil {
			return Config{}, nil, err
		}
		if err := sglangLoRAArgs(&cfg, a); err != nil {
			return Config{}, nil, err
		}
		cfg.KV.Mode = a.str("--disaggregation-mode")
		cfg.KV.TransferBackend = a.str("--disaggregation-transfer-backend")
		if cfg.KV.BootstrapPort, err = intFlag(p, a, "--disaggregation-bootstrap-port", 0); err != nil {
			return Config{}, nil, err
		}
		for _, e := range []struct {
			env string
			dst *time.Duration
		}{{"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", &cfg.KV.BootstrapTimeout}, {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT", &cfg.KV.WaitingTimeout}} {
			if v := getenv(e.env); v != "" {
				secs, err := strconv.Atoi(v)
				if err != nil || secs <= 0 {
					return fail("", "%s=%q: want a whole number of seconds above 0, as SGLang's get_int_env_var", e.env, v)
				}
				*e.dst = time.Duration(secs) * time.Second
			}
		}
		if g, err = gangOf(p, a, "--nnodes", "--node-rank"); err != nil {
			return Config{}, nil, err
		}
		if g != nil {
			addr := a.str("--dist-init-addr")
			host, port, err := net.SplitHostPort(addr)
			n, perr := strconv.Atoi(port)
			if err != nil || perr != nil {
				return fail("--dist-init-addr", "sglang.launch_server: --dist-init-addr %q: a multi-node launch needs HOST:PORT ([v6]:PORT for IPv6)", addr)
			}
			g.MasterAddr, g.MasterPort = host, n
		}
		if v := getenv("SGLANG_HEALTH_CHECK_TIMEOUT"); v != "" {
			secs, err := strconv.Atoi(v)
			if err != nil || secs <= 0 {
				return fail("", "SGLANG_HEALTH_CHECK_TIMEOUT=%q: want a whole number of seconds above 0, as SGLang's int()", v)
			}
			cfg.SGLangHealthTimeout = time.Duration(secs) * time.Second
		}
		if v := getenv("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"); v != "" {
			on, err := envBool(v)
			if err != nil {
				return fail("", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=%q: %v", v, err)
			}
			cfg.SGLangCheapHealth = !on
		}
	case PersonalityLlamaCpp:
		if a, err = t.parse(p, args, false); err != nil {
			return Config{}, nil, err
		}
		if len(a.positional) > 0 {
			return fail("", "llama-server: invalid argument: %s", a.positional[0])
		}
		if cfg.Model = a.str("-m"); cfg.Model == "" {
			return fail("--model", "llama-server: no model: give it with --model")
		}
		if n := a.str("-a"); n != "" {
			cfg.Model = n
		}
		cfg.Host, cfg.Port = "127.0.0.1", 8080
		// The flag wins over LLAMA_API_KEY, as llama.cpp's arguments win
		// over its variables.
		cfg.APIKey = getenv("LLAMA_API_KEY")
		if k := a.str("--api-key"); k != "" {
			cfg.APIKey = k
		}
		cfg.NoMetrics = !a.has("--metrics")
		slots, err := intFlag(p, a, "-np", -1)
		if err != nil {
			return Config{}, nil, err
		}
		// -np -1 (the default) is auto: llama-server runs 4 slots and
		// forces one KV stream for all (tools/server/server.cpp).
		auto := slots <= 0
		if auto {
			slots = 4
		}
		cfg.MaxRunning = slots
		if cfg.MaxModelLen, err = intFlag(p, a, "-c", 0); err != nil {
			return Config{}, nil, err
		}
		// -c is the whole KV context: each of the -np slots gets
		// n_ctx / n_parallel of it (src/llama-context.cpp, which also
		// pads it up to a multiple of 256: not modelled), unless the KV
		// cache is one stream for all (--kv-unified, or auto slots).
		if !auto && !a.has("-kvu") && cfg.MaxModelLen > 0 {
			cfg.MaxModelLen /= slots
		}
	}
	if h := a.str("--host"); h != "" {
		cfg.Host = h
	}
	if cfg.Port, err = intFlag(p, a, "--port", cfg.Port); err != nil {
		return Config{}, nil, err
	}
	if cfg.Port < 0 || cfg.Port > 65535 {
		return fail("--port", "%s: --port %d: want 0 to 65535", t.program, cfg.Port)
	}
	if err := fakeKnobs(&cfg, p, getenv); err != nil {
		return Config{}, nil, err
	}
	if err := KVEnv(&cfg, getenv); err != nil {
		return Config{}, nil, &CommandLineError{Personality: p, Msg: err.Error()}
	}
	if cfg.StepInterference, err = envFlag(getenv, EnvStepInterference); err != nil {
		return Config{}, nil, &CommandLineError{Personality: p, Msg: err.Error()}
	}
	if err := cfg.KV.defaults(); err != nil {
		return Config{}, nil, &CommandLineError{Personality: p, Msg: err.Error()}
	}
	return cfg, g, nil
}

// vllmLoRAArgs reads vLLM's LoRA flags (vllm/engine/arg_utils.py,
// LoRAConfig's fields; --lora-modules from cli_args.py). vLLM takes
// --max-loras and the rest without --enable-lora and ignores them (no
// LoRAConfig is built); --lora-modules without it fails at start, which
// NewServer does.
func vllmLoRAArgs(cfg *Config, a parsedArgs, getenv func(string) string) error {
	p := PersonalityVLLM
	cfg.EnableLoRA = a.lastOf("--enable-lora", "--no-enable-lora") == "--enable-lora"
	var err error
	for _, f := range []struct {
		flag string
		dst  *int
	}{{"--max-loras", &cfg.MaxLoRAs}, {"--max-lora-rank", &cfg.MaxLoRARank}, {"--max-cpu-loras", &cfg.MaxCPULoRAs}} {
		if *f.dst, err = intFlag(p, a, f.flag, 0); err != nil {
			return err
		}
	}
	if v, ok := a.last("--max-lora-rank"); ok && !slices.Contains(vllmMaxLoRARanks, cfg.MaxLoRARank) {
		return &CommandLineError{Personality: p, Flag: "--max-lora-rank", Msg: fmt.Sprintf(
			"vllm serve: argument --max-lora-rank: invalid choice: %s (choose from 1, 8, 16, 32, 64, 128, 256, 320, 512)", v[0])}
	}
	if v, ok := a.last("--max-loras"); ok && cfg.MaxLoRAs < 1 {
		return &CommandLineError{Personality: p, Flag: "--max-loras", Msg: fmt.Sprintf("vllm serve: --max-loras %s: want 1 or more", v[0])}
	}
	items, _ := a.last("--lora-modules")
	for _, item := range items {
		if item == "" {
			continue
		}
		m, err := ParseLoRAModule(item)
		if err != nil {
			return &CommandLineError{Personality: p, Flag: "--lora-modules", Msg: "vllm serve: " + err.Error()}
		}
		cfg.LoRAModules = append(cfg.LoRAModules, m)
	}
	cfg.RuntimeLoRA = EnvTrue(getenv(EnvVLLMRuntimeLoRA))
	return nil
}

// sglangLoRAArgs reads SGLang's LoRA flags (server_args.py): --lora-paths
// turns LoRA on by itself, as SGLang does for backward compatibility;
// --lora-target-modules and --lora-backend are read and ignored.
func sglangLoRAArgs(cfg *Config, a parsedArgs) error {
	p := PersonalitySGLang
	cfg.EnableLoRA = a.has("--enable-lora")
	var err error
	for _, f := range []struct {
		flag string
		dst  *int
	}{{"--max-loras-per-batch", &cfg.MaxLoRAs}, {"--max-lora-rank", &cfg.MaxLoRARank}, {"--max-loaded-loras", &cfg.MaxLoadedLoRAs}} {
		if *f.dst, err = intFlag(p, a, f.flag, 0); err != nil {
			return err
		}
	}
	items, _ := a.last("--lora-paths")
	for _, item := range items {
		m, err := parseSGLangLoRAPath(item)
		if err != nil {
			return &CommandLineError{Personality: p, Flag: "--lora-paths", Msg: "sglang.launch_server: " + err.Error()}
		}
		cfg.LoRAModules = append(cfg.LoRAModules, m)
	}
	if len(cfg.LoRAModules) > 0 {
		cfg.EnableLoRA = true
	}
	return nil
}

// gangOf is the Gang a multi-node command line asks for, or nil.
func gangOf(p Personality, a parsedArgs, nnodes, rank string) (*Gang, error) {
	n, err := intFlag(p, a, nnodes, 1)
	if err != nil || n <= 1 {
		return nil, err
	}
	r, err := intFlag(p, a, rank, 0)
	if err != nil {
		return nil, err
	}
	return &Gang{NNodes: n, NodeRank: r}, nil
}

// intFlag is the integer value of name's last occurrence, or def.
func intFlag(p Personality, a parsedArgs, name string, def int) (int, error) {
	v, ok := a.last(name)
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(v[0])
	if err != nil {
		return 0, &CommandLineError{Personality: p, Flag: name, Msg: fmt.Sprintf("%s %q: want an integer", name, v[0])}
	}
	return n, nil
}

// humanIntFlag is an integer that vLLM and SGLang also take with a
// suffix: k and m count thousands, K and M powers of 1024 ("32k", "128K").
// -1 (vLLM's "auto") is 0, the fake's default.
func humanIntFlag(p Personality, a parsedArgs, name string) (int, error) {
	v, ok := a.last(name)
	if !ok {
		return 0, nil
	}
	s, mult := v[0], 1
	if s != "" {
		switch s[len(s)-1] {
		case 'k':
			mult = 1000
		case 'K':
			mult = 1024
		case 'm':
			mult = 1000 * 1000
		case 'M':
			mult = 1024 * 1024
		}
		if mult > 1 {
			s = s[:len(s)-1]
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < -1 {
		return 0, &CommandLineError{Personality: p, Flag: name, Msg: fmt.Sprintf("%s %q: want a number of tokens (such as 8192 or 32k)", name, v[0])}
	}
	return max(0, n*mult), nil
}

// envBool reads a boolean as SGLang's environment does.
func envBool(v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, errors.New("want true or false (1 or 0)")
}

// fakeKnobs reads the fake's own knobs from the environment.
func fakeKnobs(cfg *Config, p Personality, getenv func(string) string) error {
	for _, k := range []struct {
		env string
		dst *time.Duration
	}{
		{EnvStartupDelay, &cfg.StartupDelay}, {EnvTokenDelay, &cfg.TokenDelay}, {EnvPrefillBase, &cfg.PrefillBase},
		{EnvPrefillPer1KTokens, &cfg.PrefillPer1KTokens}, {EnvHealthDelayPerRunning, &cfg.HealthDelayPerRunning},
		{EnvHangAfter, &cfg.HangAfter}, {EnvCrashAfter, &cfg.CrashAfter},
	} {
		v := getenv(k.env)
		if v == "" {
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return &CommandLineError{Personality: p, Msg: fmt.Sprintf("%s=%q: want a duration of 0 or more, such as 500ms or 2m", k.env, v)}
		}
		*k.dst = d
	}
	if v := getenv(EnvLoRAInfoSplit); v != "" {
		on, err := envBool(v)
		if err != nil {
			return &CommandLineError{Personality: p, Msg: fmt.Sprintf("%s=%q: %v", EnvLoRAInfoSplit, v, err)}
		}
		cfg.LoRAInfoSplit = on
	}
	cfg.ExitCode = 1
	if v := getenv(EnvExitCode); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 255 {
			return &CommandLineError{Personality: p, Msg: fmt.Sprintf("%s=%q: want an exit code, 0 to 255", EnvExitCode, v)}
		}
		cfg.ExitCode = n
	}
	return nil
}

// PersonalityArgs splits `--personality P ARGS...` (or --personality=P
// ARGS...): ok when args begin so, with the real engine's command line in
// rest. The personality must come first, since everything after it is the
// real engine's; an unknown one is an error (with ok true).
func PersonalityArgs(args []string) (p Personality, rest []string, ok bool, err error) {
	if len(args) == 0 {
		return "", nil, false, nil
	}
	name, inline := strings.CutPrefix(args[0], "--personality=")
	switch {
	case inline:
		rest = args[1:]
	case args[0] == "--personality" && len(args) > 1:
		name, rest = args[1], args[2:]
	case args[0] == "--personality":
		return "", nil, true, errors.New("fake engine: --personality needs a value: vllm, sglang or llamacpp")
	default:
		return "", nil, false, nil
	}
	if p, err = ParsePersonality(name); err != nil {
		return "", nil, true, err
	}
	return p, rest, true, nil
}

// configArgs reads an SGLang config file (YAML of flag names without their
// dashes) as the arguments it stands for. The fake reads the flat
// `name: value` form llmgw writes (quoted or not; true for a flag without
// a value), not YAML at large: a line it cannot read is an error, as
// SGLang's loader would refuse a file it cannot parse.
func configArgs(path string) ([]string, error) {
	if !strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml") {
		return nil, fmt.Errorf("want a .yaml or .yml file")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" {
			return nil, fmt.Errorf("line %d: want name: value", i+1)
		}
		switch {
		case len(value) >= 2 && value[0] == '\'' && value[len(value)-1] == '\'':
			value = strings.ReplaceAll(value[1:len(value)-1], "''", "'")
		case len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"':
			value = value[1 : len(value)-1]
		}
		if value == "true" {
			out = append(out, "--"+name)
			continue
		}
		out = append(out, "--"+name, value)
	}
	return out, nil
}

// KVEnv reads the variables of disaggregation into cfg.KV: vLLM's
// VLLM_NIXL_SIDE_CHANNEL_HOST, VLLM_NIXL_SIDE_CHANNEL_PORT and
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT (seconds) with a kv-transfer-config,
// and the fake's FAKE_ENGINE_KV_TRANSFER_PER_1K_TOKENS (default
// DefaultKVTransferPer1K), FAKE_ENGINE_KV_COMPAT_VERSION and
// FAKE_ENGINE_KV_TRANSFER_FAIL under either protocol. The plain fake's
// command calls it too.
func KVEnv(cfg *Config, getenv func(string) string) error {
	k := &cfg.KV
	if !k.active() {
		return nil
	}
	if k.nixl() {
		k.SideChannelHost = getenv("VLLM_NIXL_SIDE_CHANNEL_HOST")
		if v := getenv("VLLM_NIXL_SIDE_CHANNEL_PORT"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 || n > 65535 {
				return fmt.Errorf("VLLM_NIXL_SIDE_CHANNEL_PORT=%q: want a port", v)
			}
			k.SideChannelPort = n
		}
		if v := getenv("VLLM_NIXL_ABORT_REQUEST_TIMEOUT"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return fmt.Errorf("VLLM_NIXL_ABORT_REQUEST_TIMEOUT=%q: want a whole number of seconds above 0", v)
			}
			k.AbortRequestTimeout = time.Duration(n) * time.Second
		}
	}
	k.TransferPer1KTokens = DefaultKVTransferPer1K
	if v := getenv(EnvKVTransferPer1KTokens); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("%s=%q: want a duration of 0 or more, such as 5ms", EnvKVTransferPer1KTokens, v)
		}
		k.TransferPer1KTokens = d
	}
	k.CompatVersion = getenv(EnvKVCompatVersion)
	var err error
	k.FailTransfers, err = envFlag(getenv, EnvKVTransferFail)
	return err
}

// envFlag reads a boolean variable; unset is false.
func envFlag(getenv func(string) string, name string) (bool, error) {
	v := getenv(name)
	if v == "" {
		return false, nil
	}
	on, err := envBool(v)
	if err != nil {
		return false, fmt.Errorf("%s=%q: %v", name, v, err)
	}
	return on, nil
}
