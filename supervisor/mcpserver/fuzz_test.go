package mcpserver

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// FuzzToolArguments sends arbitrary JSON as the arguments of every tool.
// No input may panic or break the protocol: whatever the handler makes of
// it comes back as a tool result, and arguments that are not an object, or
// name a field the tool's schema lacks, come back as a tool error.
//
//	go test ./supervisor/mcpserver -run '^$' -fuzz FuzzToolArguments -fuzztime 60s
func FuzzToolArguments(f *testing.F) {
	tn := startNode(f, "alpha")
	ctx := context.Background()
	ct, st := mcp.NewInMemoryTransports()
	ss, err := tn.mcp.MCPServer().Connect(ctx, st, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "fuzz"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = cs.Close() })
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		f.Fatal(err)
	}
	var names []string
	props := map[string]map[string]bool{}
	for _, t := range list.Tools {
		names = append(names, t.Name)
		var s struct {
			Properties map[string]json.RawMessage `json:"properties"`
		}
		b, _ := json.Marshal(t.InputSchema)
		_ = json.Unmarshal(b, &s)
		props[t.Name] = map[string]bool{}
		for p := range s.Properties {
			props[t.Name][p] = true
		}
	}
	for i := range names {
		for _, seed := range []string{
			`{}`, `null`, `[]`, `"x"`, `7`, `{"node":"alpha"}`, `{"node":"nobody"}`, `{"node":7}`,
			`{"view":"apps"}`, `{"view":"../../x"}`, `{"name":"../../etc/passwd"}`, `{"name":"engine.log","lines":-1}`,
			`{"name":"engine.log","filter":"(?i)READY","lines":1e9}`, `{"device":"mlx5_0/../../"}`,
			`{"deployment":"chat"}`, `{"shard":"chat-0"}`, `{"deployment":"a","shard":"b"}`,
			`{"spec":{"name":"chat","model":"m","engine":"fake","replicas":1}}`, `{"spec":{"name":"chat","replicas":-1}}`,
			`{"spec":"name: chat"}`, `{"spec":{"name":"chat","gpu_memory":"1e400GiB"}}`, `{"name":""}`, `{"status":"ready","node":""}`,
		} {
			f.Add(uint8(i), []byte(seed))
		}
	}
	f.Fuzz(func(t *testing.T, pick uint8, raw []byte) {
		name := names[int(pick)%len(names)]
		args := json.RawMessage(raw)
		if !json.Valid(raw) {
			args, _ = json.Marshal(string(raw))
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s %s: protocol error %v", name, args, err)
		}
		if res == nil {
			t.Fatalf("%s %s: no result", name, args)
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(args, &obj); err != nil {
			if !res.IsError {
				t.Fatalf("%s %s: arguments that are not an object were accepted: %s", name, args, text(res))
			}
			return
		}
		for k := range obj {
			if !props[name][k] && !res.IsError {
				t.Fatalf("%s %s: unknown argument %q accepted: %s", name, args, k, text(res))
			}
		}
		if res.IsError && text(res) == "" {
			t.Fatalf("%s %s: tool error without a message", name, args)
		}
	})
}
