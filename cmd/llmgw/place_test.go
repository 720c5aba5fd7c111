package main

import (
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// `place` says what it did to the spec, how many replicas can be placed
// now and why not the rest; --wait blocks until ready (status 0) or says
// why not (status 1). Against a real node with one simulated GPU.
func TestPlaceSaysWhatHappenedAndWaits(t *testing.T) {
	n := startNode(t, "n1", t.TempDir(), "--simulate-gpus", "2xH100-80GB")
	cli := func(args ...string) (string, error) {
		return run(t, append(args, "--addr", n.api, "--token-file", filepath.Join(n.dataDir, "token"))...)
	}
	out, err := cli("place", "chat", "--model", "m/tiny", "--engine", "fake", "--wait=20s")
	if err != nil {
		t.Fatalf("place --wait: %v\n%s", err, out)
	}
	for _, want := range []string{"placed chat (m/tiny, spec ", "): new deployment\n", "1 of 1 replicas can be placed now", "ready: 1 of 1 replicas of chat serve"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if out, err = cli("place", "chat", "--model", "m/tiny", "--engine", "fake"); err != nil || !strings.Contains(out, "unchanged: the cluster already had this spec") {
		t.Errorf("the same place again: %v\n%s", err, out)
	}

	// Two GPUs: one of three replicas cannot be placed, and --wait says
	// why not when its time runs out.
	out, err = cli("place", "chat", "--model", "m/tiny", "--engine", "fake", "--replicas", "3", "--wait=1500ms")
	var ce codedError
	if !errors.As(err, &ce) || ce.code != 1 {
		t.Fatalf("--wait short of ready: err %v (want exit status 1)\n%s", err, out)
	}
	for _, want := range []string{"replicas changed, same spec", "2 of 3 replicas can be placed now, ", " ready; why not the rest:\n  chat-2: needs 1 whole GPU", "waiting: 2 of 3 replicas ready, 2 placed; why:\n  chat-2: "} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`^chat not ready after 1\.5s: 2 of 3 replicas ready, 2 placed; why: chat-2: needs 1 whole GPU.+`).MatchString(err.Error()) || strings.Contains(err.Error(), "\n") {
		t.Errorf("the reason why not, in one line: %q", err)
	}
	prev := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "waiting:") {
			if l == prev {
				t.Errorf("progress repeated though nothing changed:\n%s", out)
			}
			prev = l
		}
	}

	// A shard that never started says so in one line.
	_, err = cli("logs", "chat-2")
	if err == nil || !strings.Contains(err.Error(), `shard "chat-2" never started: placement put it on no node: `) || strings.Contains(err.Error(), "\n") {
		t.Errorf("logs of an unplaced shard: %v", err)
	}
	_, err = cli("logs", "nope-0")
	if err == nil || !strings.Contains(err.Error(), `no shard "nope-0" (shards: chat-0, chat-1, chat-2)`) {
		t.Errorf("logs of an unknown shard: %v", err)
	}

	if out, err = cli("place", "chat", "--model", "m/other", "--engine", "fake", "--replicas", "1", "--wait=20s"); err != nil || !strings.Contains(out, "spec changed: replicas roll") || !strings.Contains(out, "ready: 1 of 1") {
		t.Errorf("a changed spec with --wait: %v\n%s", err, out)
	}
	if _, err := cli("place", "chat", "--model", "m/other", "--wait=soon"); err == nil || !strings.Contains(err.Error(), "want a duration such as 10m") {
		t.Errorf("--wait=soon: %v", err)
	}
}

// A deployment of prefill and decode roles from place's flags: its
// replicas are named for their role, shards says each one's role (in
// --json too), and models lists the roles. Flags that contradict the
// roles are refused, naming the flag or the field.
func TestPlaceRoles(t *testing.T) {
	n := startNode(t, "n1", t.TempDir(), "--simulate-gpus", "2xH100-80GB")
	cli := func(args ...string) (string, error) {
		return run(t, append(args, "--addr", n.api, "--token-file", filepath.Join(n.dataDir, "token"))...)
	}
	if out, err := cli("place", "pd", "--model", "m/tiny", "--engine", "fake", "--prefill-replicas", "1", "--decode-replicas", "1", "--wait=30s"); err != nil || !strings.Contains(out, "ready: 2 of 2 replicas of pd serve") {
		t.Fatalf("place with roles: %v\n%s", err, out)
	}
	out, err := cli("shards")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []*regexp.Regexp{regexp.MustCompile(`(?m)^SHARD\s+ROLE\s+RANK`), regexp.MustCompile(`(?m)^pd-d0\s+decode\s`), regexp.MustCompile(`(?m)^pd-p0\s+prefill\s`)} {
		if !want.MatchString(out) {
			t.Errorf("shards lacks %s:\n%s", want, out)
		}
	}
	if out, err = cli("shards", "--json"); err != nil || !strings.Contains(out, `"role": "prefill"`) || !strings.Contains(out, `"role": "decode"`) {
		t.Errorf("shards --json: %v\n%s", err, out)
	}
	if out, err = cli("models"); err != nil || !regexp.MustCompile(`(?m)^\s+prefill\s+-\s+role\s+1/1\s+1`).MatchString(out) {
		t.Errorf("models: %v\n%s", err, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--replicas", "2", "--prefill-replicas", "1", "--decode-replicas", "1"}, "--replicas: not with --prefill-replicas and --decode-replicas"},
		{[]string{"--prefill-replicas", "1"}, "decode: invalid value"},
		{[]string{"--pd-fallback"}, "--pd-fallback: only with --prefill-replicas and --decode-replicas"},
		{[]string{"--engine", "llamacpp", "--prefill-replicas", "1", "--decode-replicas", "1"}, "prefill: invalid value \"engine llamacpp\""},
	} {
		args := append([]string{"place", "x", "--model", "m/tiny"}, c.args...)
		if _, err := cli(args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
