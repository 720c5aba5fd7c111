package scenarios

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// currentBinary names the runner's own llmgw binary (Options.Binary).
const currentBinary = "current"

// cmdBuildBinary is `build-binary NAME commit=REV`: build the llmgw binary
// of an earlier commit of this repository, so a scenario can run a
// cluster of the previous release and upgrade it node by node. The source
// is `git archive` of REV from the repository the runner is started in
// (the scenarios' tests run in scenarios/, inside it), built with the go
// command on PATH into the run's work dir; the module cache serves the
// commit's modules. A commit missing from the clone (a shallow CI clone)
// is an error, not a skip: an upgrade test that quietly does not run
// proves nothing.
func (r *runner) cmdBuildBinary(d *directive) (string, time.Time, error) {
	name, err := d.nextPos("binary name")
	if err != nil {
		return "", time.Time{}, err
	}
	if !keyRE.MatchString(name) || name == currentBinary {
		return "", time.Time{}, usagef("build-binary %s: want lower-case letters, digits and '-', not %q", name, currentBinary)
	}
	if _, ok := r.binaries[name]; ok {
		return "", time.Time{}, usagef("build-binary %s: built already", name)
	}
	rev, err := d.need("commit")
	if err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	bin, err := buildAtCommit(r.ctx, rev, filepath.Join(r.work, "build-"+name))
	if err != nil {
		return "", time.Time{}, err
	}
	r.binaries[name] = bin
	return fmt.Sprintf("built %s from commit %s", name, rev), at, nil
}

// buildAtCommit extracts commit rev of the repository around the working
// directory into dir/src and builds dir/llmgw from it.
func buildAtCommit(ctx context.Context, rev, dir string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	top, err := runIn(ctx, "", "git", "rev-parse", "--show-toplevel")
	if err != nil {
		return "", fmt.Errorf("build-binary: not inside the llmgw git repository: %w", err)
	}
	top = strings.TrimSpace(top)
	if _, err := runIn(ctx, top, "git", "cat-file", "-e", rev+"^{commit}"); err != nil {
		return "", fmt.Errorf("build-binary: commit %s is not in this clone (a shallow clone? run: git fetch --unshallow): %w", rev, err)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	archive := exec.CommandContext(ctx, "git", "-C", top, "archive", "--format=tar", rev)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return "", err
	}
	untar.Stdin = pipe
	var aerr, terr bytes.Buffer
	archive.Stderr, untar.Stderr = &aerr, &terr
	if err := untar.Start(); err != nil {
		return "", fmt.Errorf("build-binary: tar: %w", err)
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return "", fmt.Errorf("build-binary: git archive %s: %w: %s", rev, err, strings.TrimSpace(aerr.String()))
	}
	if err := untar.Wait(); err != nil {
		return "", fmt.Errorf("build-binary: tar: %w: %s", err, strings.TrimSpace(terr.String()))
	}
	bin := filepath.Join(dir, "llmgw")
	build := exec.CommandContext(ctx, "go", "build", "-ldflags", "-X main.version="+shortRev(rev), "-o", bin, "./cmd/llmgw")
	build.Dir = src
	// go-nvml's cgo bindings call functions the NVML header marks
	// deprecated (the Makefile sets the same).
	build.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations", "GOFLAGS=-mod=readonly")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build-binary: go build at %s: %w: %s", rev, err, lastLines(string(out), 10))
	}
	return bin, nil
}

func runIn(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

func shortRev(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// binaryKey reads binary=NAME: a binary built by build-binary, or
// "current" (the default).
func (r *runner) binaryKey(d *directive) (string, error) {
	name, err := d.str("binary", currentBinary)
	if err != nil {
		return "", err
	}
	if _, ok := r.binaries[name]; !ok {
		return "", usagef("binary=%s: no such binary (have %s; build-binary NAME commit=REV builds one)", name,
			strings.Join(slices.Sorted(maps.Keys(r.binaries)), ", "))
	}
	return name, nil
}

// binaryPaths lists every binary of the run, for finding its engines.
func (r *runner) binaryPaths() []string { return slices.Sorted(maps.Values(r.binaries)) }
