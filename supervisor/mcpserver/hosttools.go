package mcpserver

import (
	"context"
	"fmt"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/llmgw/llmgw/probes/host"
)

// hostIn is every argument a host tool can take. Each tool's input schema
// keeps only node and the fields its host.Tool.Params name, so a client
// sees (and the SDK enforces) exactly what that tool reads.
type hostIn struct {
	Node   string  `json:"node,omitempty" jsonschema:"run on this node (a name from the nodes tool); this node if empty"`
	View   string  `json:"view,omitempty"`
	Name   string  `json:"name,omitempty"`
	Filter string  `json:"filter,omitempty"`
	Lines  int     `json:"lines,omitempty"`
	Device string  `json:"device,omitempty"`
	Rounds int     `json:"rounds,omitempty"`
	GapS   float64 `json:"gap_s,omitempty"`
}

func (in hostIn) args() host.Args {
	return host.Args{View: in.View, Name: in.Name, Filter: in.Filter, Lines: in.Lines, Device: in.Device, Rounds: in.Rounds, GapS: in.GapS}
}

// hostSchema is hostIn's schema cut down to one tool's parameters.
func hostSchema(t host.Tool) (*jsonschema.Schema, error) {
	full, err := jsonschema.For[hostIn](nil)
	if err != nil {
		return nil, err
	}
	keep := map[string]*jsonschema.Schema{"node": full.Properties["node"]}
	order := []string{"node"}
	for _, p := range t.Params {
		ps, ok := full.Properties[p.Name]
		if !ok {
			return nil, fmt.Errorf("host tool %s: parameter %q is not a field of host.Args", t.Name, p.Name)
		}
		c := *ps
		c.Description = p.Description
		keep[p.Name] = &c
		order = append(order, p.Name)
	}
	full.Properties = keep
	full.PropertyOrder = order
	full.Required = nil
	return full, nil
}

func (s *Server) addHostTools(tools []host.Tool) {
	for _, t := range tools {
		schema, err := hostSchema(t)
		if err != nil {
			panic(err) // a host tool declares a parameter hostIn lacks: a programming error
		}
		desc := t.Description + " The answer is the command's raw output, stamped with the host and time it came from." +
			" With node set to another node's name, the call runs there."
		run := t.Run
		name := t.Name
		mcp.AddTool(s.srv, &mcp.Tool{Name: name, Description: desc, InputSchema: schema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
			func(ctx context.Context, req *mcp.CallToolRequest, in hostIn) (*mcp.CallToolResult, any, error) {
				start := time.Now()
				if in.Node != "" && in.Node != s.self() {
					res, err := s.forward(ctx, req, in.Node)
					s.observe(name, "forwarded", start, err != nil || (res != nil && res.IsError))
					return res, nil, err
				}
				out, err := run(ctx, in.args())
				s.observe(name, "local", start, err != nil)
				if err != nil {
					return nil, nil, fmt.Errorf("%s on %s: %w", name, s.self(), err)
				}
				return textResult(out), nil, nil
			})
		s.names = append(s.names, name)
	}
}
