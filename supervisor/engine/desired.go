package engine

import "github.com/llmgw/llmgw/placement"

// Desired is one shard the plan gives this node, with the spec it runs.
type Desired struct {
	placement.Assignment
	Spec placement.Deployment
}
