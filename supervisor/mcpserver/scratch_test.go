package mcpserver

import (
	"encoding/json"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/llmgw/llmgw/supervisor"
)

type hin struct {
	Node  string `json:"node,omitempty" jsonschema:"the node"`
	Lines int    `json:"lines,omitempty" jsonschema:"lines"`
	Spec map[string]any `json:"spec"`
}

func TestScratch(t *testing.T) {
	s, err := jsonschema.For[hin](nil)
	b, _ := json.Marshal(s)
	t.Log(string(b), err)
	s2, err := jsonschema.For[supervisor.ShardInfo](nil)
	b, _ = json.Marshal(s2)
	t.Log(string(b), err)
}
