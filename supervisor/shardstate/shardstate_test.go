package shardstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/llmgw/llmgw/internal/protocol"
)

func sample(id string) State {
	code := 137
	return State{
		ShardID:   id,
		ReplicaID: "llama-0",
		PID:       4242,
		StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
		Spec: Spec{
			Engine: "vllm", ServedModelName: "llama", Model: "meta-llama/Llama-3.1-8B-Instruct",
			Deployment: "llama", GPUIndices: []int{0, 1}, HTTPPort: 18001, ReplicaID: "llama-0",
			SpecVersion: "abc123def456", Image: "vllm/vllm-openai:latest",
			Command: []string{"vllm", "serve", "m"}, Runtime: "containerd",
			EngineID: id + "-abc123def456", ContainerID: id + "-abc123def456",
		},
		Restarts:     2,
		LastExitCode: &code,
		LastExitAt:   time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC),
		ClaimStamp:   1767322800000,
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	for _, id := range []string{"llama-1", "llama-0", "big-0-s1"} {
		if err := Save(dir, sample(id)); err != nil {
			t.Fatal(err)
		}
	}
	states, bad := Load(dir)
	if len(bad) != 0 {
		t.Fatalf("bad: %v", bad)
	}
	var ids []string
	for _, s := range states {
		ids = append(ids, s.ShardID)
	}
	if strings.Join(ids, ",") != "big-0-s1,llama-0,llama-1" {
		t.Fatalf("ids %v, want sorted", ids)
	}
	want := sample("llama-0")
	want.Protocol, want.FormatVersion = Protocol, FormatVersion
	if !reflect.DeepEqual(states[1], want) {
		t.Fatalf("round trip\n got %+v\nwant %+v", states[1], want)
	}
	// Saving again replaces the file.
	s := sample("llama-0")
	s.Restarts = 3
	if err := Save(dir, s); err != nil {
		t.Fatal(err)
	}
	states, _ = Load(dir)
	if states[1].Restarts != 3 {
		t.Fatalf("restarts %d after overwrite", states[1].Restarts)
	}
}

// TestFileFields pins the JSON names other tools (and older agents) read.
func TestFileFields(t *testing.T) {
	dir := t.TempDir()
	st := sample("a-0")
	if err := Save(dir, st); err != nil {
		t.Fatal(err)
	}
	// Named after the engine: shard and spec version.
	b, err := os.ReadFile(filepath.Join(dir, "shard-"+st.Spec.EngineID+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"protocol", "format_version", "shard_id", "replica_id", "pid", "started_at", "spec", "restarts", "last_exit_code", "claim_stamp"} {
		if _, ok := m[k]; !ok {
			t.Errorf("field %q missing", k)
		}
	}
	spec := m["spec"].(map[string]any)
	for _, k := range []string{"engine", "served_model_name", "gpu_indices", "http_port", "replica_id", "spec_version", "image", "command", "engine_id", "container_id"} {
		if _, ok := spec[k]; !ok {
			t.Errorf("spec field %q missing", k)
		}
	}
	// format_version stays 1, which agents from before protocol versions
	// accept: going back to one still adopts these engines.
	if m["format_version"].(float64) != 1 || m["protocol"].(float64) != 2 {
		t.Errorf("format_version %v protocol %v, want 1 and 2", m["format_version"], m["protocol"])
	}
}

// The file 9f0749d's own Save wrote (testdata/9f0749d), before files said
// their protocol: Load reads it as protocol 1 with every field intact, and
// saving it again writes this build's protocol and changes nothing else.
func TestPreviousReleasesFileLoads(t *testing.T) {
	const name = "shard-chat-0-abc123def456.json"
	old, err := os.ReadFile(filepath.Join("testdata", "9f0749d", name))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, name), old, 0o600); err != nil {
		t.Fatal(err)
	}
	states, bad := Load(dir)
	if len(bad) != 0 || len(states) != 1 {
		t.Fatalf("Load: states %+v bad %v", states, bad)
	}
	code := 137
	want := State{Protocol: 1, FormatVersion: 1, ShardID: "chat-0", ReplicaID: "chat-0", PID: 4242,
		StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
		Spec: Spec{Engine: "vllm", ServedModelName: "chat", Model: "meta-llama/Llama-3.1-8B-Instruct",
			Deployment: "chat", GPUIndices: []int{0, 1}, MemoryPerGPU: 20 << 30, GPUUUIDs: []string{"GPU-a", "GPU-b"},
			HTTPPort: 18001, ReplicaID: "chat-0", SpecVersion: "abc123def456", Image: "vllm/vllm-openai:v0.8.5",
			Command: []string{"vllm", "serve", "m"}, Runtime: "containerd", EngineID: "chat-0-abc123def456", ContainerID: "chat-0-abc123def456"},
		Restarts: 2, LastExitCode: &code, LastExitAt: time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC), ClaimStamp: 1767322800000,
		Gang: &Gang{Rank: 1, Size: 2, Generation: 7, MasterAddr: "10.0.0.2", MasterPort: 29500, Members: []string{"gpu-0", "gpu-1"}},
	}
	if !reflect.DeepEqual(states[0], want) {
		t.Fatalf("the previous release's file read as\n %+v\nwant\n %+v", states[0], want)
	}
	if err := Save(dir, states[0]); err != nil {
		t.Fatal(err)
	}
	now, _ := os.ReadFile(filepath.Join(dir, name))
	var a, b map[string]any
	if err := json.Unmarshal(old, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(now, &b); err != nil {
		t.Fatal(err)
	}
	if b["protocol"] != float64(2) {
		t.Errorf("saved again: protocol %v, want 2", b["protocol"])
	}
	delete(b, "protocol")
	if !reflect.DeepEqual(a, b) {
		t.Errorf("saved again, the fields changed:\n%s\nwas\n%s", now, old)
	}
}

// A file an llmgw of a newer protocol wrote is reported, saying its
// protocol and what to install, and left in place: it is not corrupt.
func TestNewerProtocolFileLeftInPlace(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "shard-chat-0-v9.json")
	above := protocol.Max + 1
	content := fmt.Sprintf(`{"protocol":%d,"format_version":1,"shard_id":"chat-0","spec":{"engine_id":"chat-0-v9"}}`, above)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	states, bad := Load(dir)
	if len(states) != 0 || len(bad) != 1 || bad[0].MovedTo != "" || !strings.Contains(bad[0].Error(), fmt.Sprintf("protocol %d", above)) ||
		!strings.Contains(bad[0].Error(), fmt.Sprintf("protocol %d or later", above)) {
		t.Fatalf("Load: states %v bad %+v; want the file reported as protocol %d and left in place", states, bad, above)
	}
	if b, _ := os.ReadFile(p); string(b) != content {
		t.Fatalf("the file changed to %q", b)
	}
}

func TestRejectsUnsafeIDs(t *testing.T) {
	dir := t.TempDir()
	for _, id := range []string{"", "../x", "a/b", "a..b", ".hidden", "-x", strings.Repeat("a", 254), "a b", "a\x00b"} {
		if err := Save(dir, State{ShardID: id}); err == nil {
			t.Errorf("Save(%q) succeeded", id)
		}
		if err := Remove(dir, id); err == nil {
			t.Errorf("Remove(%q) succeeded", id)
		}
	}
	for _, id := range []string{"llama-0", "big-0-s3", "a", "x.y-1"} {
		if err := ValidID(id); err != nil {
			t.Errorf("ValidID(%q) = %v", id, err)
		}
	}
}

// TestCorruptFilesMovedAside covers a truncated file, garbage, a file whose
// shard ID disagrees with its name, and a newer format (left in place).
func TestCorruptFilesMovedAside(t *testing.T) {
	dir := t.TempDir()
	if err := Save(dir, sample("good-0")); err != nil {
		t.Fatal(err)
	}
	full, _ := json.Marshal(sample("trunc-0"))
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("shard-trunc-0.json", string(full[:len(full)/2]))
	write("shard-empty-0.json", "")
	write("shard-garbage-0.json", "\x00\x01not json")
	write("shard-other-0.json", `{"format_version":1,"shard_id":"someone-else"}`)
	write("shard-future-0.json", `{"format_version":99,"shard_id":"future-0"}`)
	// An earlier run already moved a trunc-0 aside: keep that evidence.
	write("shard-trunc-0.json.corrupt-1", "old evidence")
	write("unrelated.txt", "ignored")

	states, bad := Load(dir)
	if len(states) != 1 || states[0].ShardID != "good-0" {
		t.Fatalf("states %+v", states)
	}
	byName := map[string]BadFile{}
	for _, b := range bad {
		byName[filepath.Base(b.Path)] = b
	}
	for name, moved := range map[string]string{
		"shard-trunc-0.json":   "shard-trunc-0.json.corrupt-2",
		"shard-empty-0.json":   "shard-empty-0.json.corrupt-1",
		"shard-garbage-0.json": "shard-garbage-0.json.corrupt-1",
		"shard-other-0.json":   "shard-other-0.json.corrupt-1",
		"shard-future-0.json":  "",
	} {
		b, ok := byName[name]
		if !ok {
			t.Errorf("%s not reported", name)
			continue
		}
		if filepath.Base(b.MovedTo) != filepath.Base(moved) || (moved == "") != (b.MovedTo == "") {
			t.Errorf("%s moved to %q, want %q", name, b.MovedTo, moved)
		}
		if b.Err == nil || b.Error() == "" {
			t.Errorf("%s: no error", name)
		}
	}
	if len(bad) != 5 {
		t.Errorf("%d bad files, want 5: %v", len(bad), bad)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "shard-trunc-0.json.corrupt-1")); string(b) != "old evidence" {
		t.Errorf("earlier evidence overwritten")
	}
	// A second load is clean apart from the newer-format file.
	states, bad = Load(dir)
	if len(states) != 1 || len(bad) != 1 || filepath.Base(bad[0].Path) != "shard-future-0.json" {
		t.Fatalf("second load: states %d bad %v", len(states), bad)
	}
}

// A file that cannot be read this time (EACCES, EIO, too many open files)
// may be fine: it is reported and left where it is, not moved aside.
func TestUnreadableFileStaysInPlace(t *testing.T) {
	dir := t.TempDir()
	if err := Save(dir, sample("good-0")); err != nil {
		t.Fatal(err)
	}
	eio := errors.New("input/output error")
	states, bad := load(dir, func(string) ([]byte, error) { return nil, eio })
	if len(states) != 0 || len(bad) != 1 || !errors.Is(bad[0].Err, eio) || bad[0].MovedTo != "" {
		t.Fatalf("states %v bad %+v; want the file reported with its read error, not moved", states, bad)
	}
	if states, bad := Load(dir); len(states) != 1 || len(bad) != 0 {
		t.Fatalf("the next load: states %v bad %v; want the file back", states, bad)
	}
}

// TestCrashMidWrite leaves what a Save killed before its rename leaves: a
// temp file with part of the new state next to the intact old file.
func TestCrashMidWrite(t *testing.T) {
	dir := t.TempDir()
	old := sample("llama-0")
	if err := Save(dir, old); err != nil {
		t.Fatal(err)
	}
	newer := sample("llama-0")
	newer.Restarts = 9
	b, _ := json.Marshal(newer)
	f, err := os.CreateTemp(dir, ".shard-llama-0.json"+tmpMarker+"*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b[:len(b)/3]); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// A temp file of a shard that never had a completed Save.
	if err := os.WriteFile(filepath.Join(dir, ".shard-new-0.json"+tmpMarker+"123"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}

	states, bad := Load(dir)
	if len(bad) != 0 {
		t.Fatalf("bad %v", bad)
	}
	if len(states) != 1 || states[0].Restarts != old.Restarts {
		t.Fatalf("states %+v, want the old state only", states)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), tmpMarker) {
			t.Errorf("temp file %s not cleaned", e.Name())
		}
	}
}

func TestRemove(t *testing.T) {
	dir := t.TempDir()
	st := sample("x-0")
	if err := Save(dir, st); err != nil {
		t.Fatal(err)
	}
	if err := Remove(dir, FileID(st)); err != nil {
		t.Fatal(err)
	}
	if err := Remove(dir, FileID(st)); err != nil {
		t.Fatalf("second Remove = %v, want nil", err)
	}
	if states, bad := Load(dir); len(states) != 0 || len(bad) != 0 {
		t.Fatalf("after remove: %v %v", states, bad)
	}
}

func TestLoadMissingDir(t *testing.T) {
	states, bad := Load(filepath.Join(t.TempDir(), "nope"))
	if states != nil || bad != nil {
		t.Fatalf("%v %v", states, bad)
	}
}

func TestSaveLeavesNoTempOnError(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	if err := Save(dir, sample("a-0")); err == nil {
		t.Fatal("Save into a missing dir succeeded")
	}
}

// During a rolling update the old and new spec of one shard can run on the
// same node: each keeps its own file.
func TestTwoSpecsOfOneShardKeepSeparateFiles(t *testing.T) {
	dir := t.TempDir()
	old, cur := sample("x-0"), sample("x-0")
	old.Spec.SpecVersion, old.Spec.EngineID = "old", "x-0-old"
	cur.Spec.SpecVersion, cur.Spec.EngineID = "new", "x-0-new"
	for _, s := range []State{old, cur} {
		if err := Save(dir, s); err != nil {
			t.Fatal(err)
		}
	}
	states, bad := Load(dir)
	if len(states) != 2 || len(bad) != 0 {
		t.Fatalf("got %d states, %v bad; want both specs", len(states), bad)
	}
	if err := Remove(dir, FileID(old)); err != nil {
		t.Fatal(err)
	}
	if states, _ := Load(dir); len(states) != 1 || states[0].Spec.SpecVersion != "new" {
		t.Fatalf("removing the old spec touched the new one: %+v", states)
	}
}

// dirContents maps every file name in dir to its content.
func dirContents(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(b)
	}
	return out
}

// Read, for a viewer, parses as Load does and changes nothing: corrupt
// files and temp files stay exactly as they were. Load then cleans up.
func TestReadChangesNothing(t *testing.T) {
	dir := t.TempDir()
	if err := Save(dir, sample("good-0")); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"shard-trunc-0.json":                   `{"format_version":1,"shard_id":"tr`,
		"shard-future-0.json":                  `{"format_version":99,"shard_id":"future-0"}`,
		".shard-good-0.json" + tmpMarker + "1": "{",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	before := dirContents(t, dir)
	for range 2 {
		states, bad := Read(dir)
		if len(states) != 1 || states[0].ShardID != "good-0" {
			t.Fatalf("Read states %+v", states)
		}
		if len(bad) != 2 {
			t.Fatalf("Read bad %v, want the truncated and the newer file", bad)
		}
		for _, b := range bad {
			if b.MovedTo != "" || b.Err == nil {
				t.Errorf("Read reported %+v; want an error and nothing moved", b)
			}
		}
		if after := dirContents(t, dir); !reflect.DeepEqual(after, before) {
			t.Fatalf("Read changed the dir\nbefore %q\n after %q", before, after)
		}
	}
	// The agent's Load parses the same files the same way, then cleans.
	states, bad := Load(dir)
	if len(states) != 1 || len(bad) != 2 {
		t.Fatalf("Load: states %v bad %v", states, bad)
	}
	after := dirContents(t, dir)
	if _, ok := after["shard-trunc-0.json"]; ok || after["shard-trunc-0.json.corrupt-1"] != before["shard-trunc-0.json"] {
		t.Errorf("Load did not move the truncated file aside: %q", after)
	}
	if _, ok := after[".shard-good-0.json"+tmpMarker+"1"]; ok {
		t.Errorf("Load left the temp file")
	}
}

func TestReadMissingDir(t *testing.T) {
	states, bad := Read(filepath.Join(t.TempDir(), "nope"))
	if len(states) != 0 || len(bad) != 0 {
		t.Fatalf("states %v bad %v", states, bad)
	}
}
