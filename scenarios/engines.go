package scenarios

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Real engines on PATH. The vllm and sglang profiles start their engine by
// command (`vllm serve MODEL ...`, `python3 -m sglang.launch_server ...`),
// found on the agent's PATH. Every node the runner starts has, first on
// its PATH, a directory of the run's own holding two scripts that play
// those engines with the fake engine's personalities, through the real
// profiles' command lines:
//
//	vllm     exec <llmgw> engine fake --personality vllm "$@"
//	python3  exec <llmgw> engine fake --personality sglang "$@" when its
//	         arguments begin with -m sglang.launch_server, else the real
//	         python3 of the runner's PATH
//
// exec keeps the pid, and the process is the llmgw binary with argv[1]
// "engine": engineProcs, the teardown and crash-engine find these engines
// as they find the plain fake.

// writeEngineShims writes the scripts into dir.
func writeEngineShims(dir, binary string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	bin := shellQuote(binary)
	python := `echo "python3: not on the scenario runner's PATH" >&2
exit 127`
	if p, err := exec.LookPath("python3"); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			python = "exec " + shellQuote(abs) + ` "$@"`
		}
	}
	shims := map[string]string{
		"vllm": `#!/bin/sh
# The scenario runner's vLLM: the fake engine's vllm personality.
exec ` + bin + ` engine fake --personality vllm "$@"
`,
		"python3": `#!/bin/sh
# The scenario runner's python3: SGLang's launcher is the fake engine's
# sglang personality; anything else is the real python3.
if [ "$1" = "-m" ] && [ "$2" = "sglang.launch_server" ]; then
	exec ` + bin + ` engine fake --personality sglang "$@"
fi
` + python + `
`,
	}
	for name, body := range shims {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// nodeEnv is the environment of a node process: the runner's, with the
// run's bin dir first on PATH.
func (r *runner) nodeEnv() []string {
	env := make([]string, 0, len(os.Environ())+2)
	path := r.binDir
	for _, kv := range os.Environ() {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			if v != "" {
				path += string(os.PathListSeparator) + v
			}
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PATH="+path, "GOTRACEBACK=all")
}

// nodeFlag is a cluster key passed to every node as `llmgw node up` flag
// of the same name.
type nodeFlag struct {
	key     string
	integer bool // else a duration, unless text
	text    bool // any word
}

// nodeFlags are the node flags the cluster command passes on: the engines'
// readiness rule and the gateway's bounds. A function, as commandTable,
// so that no table is package state.
func nodeFlags() []nodeFlag {
	return []nodeFlag{
		{key: "engine-probe-timeout"},
		{key: "engine-probe-failures", integer: true},
		{key: "engine-progress-window"},
		{key: "engine-hung-restart"},
		{key: "engine-start-timeout"},
		{key: "gateway-first-byte-timeout"},
		{key: "gateway-stream-idle-timeout"},
		{key: "priority-header", text: true},
	}
}

// nodeFlagKeys lists nodeFlags' keys, space-separated, for commandTable.
func nodeFlagKeys() string {
	flags := nodeFlags()
	keys := make([]string, len(flags))
	for i, f := range flags {
		keys[i] = f.key
	}
	return strings.Join(keys, " ")
}

// readNodeFlags reads the node flags d gives, checked, as arguments of
// `llmgw node up`.
func readNodeFlags(d *directive) ([]string, error) {
	var args []string
	for _, f := range nodeFlags() {
		if !d.has(f.key) {
			continue
		}
		switch {
		case f.text:
		case f.integer:
			if _, err := d.integer(f.key, 0); err != nil {
				return nil, err
			}
		default:
			if _, err := d.duration(f.key, 0); err != nil {
				return nil, err
			}
		}
		v, _ := d.str(f.key, "")
		args = append(args, "--"+f.key, v)
	}
	return args, nil
}

// describeNodeFlags is the cluster output's part about them.
func describeNodeFlags(args []string) string {
	if len(args) == 0 {
		return ""
	}
	var parts []string
	for i := 0; i+1 < len(args); i += 2 {
		parts = append(parts, fmt.Sprintf("%s %s", strings.TrimPrefix(args[i], "--"), args[i+1]))
	}
	return "; " + strings.Join(parts, ", ")
}
