package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/supervisor/fakeengine"
)

// TestMain lets the test binary serve as the fake engine (see
// fakeengine.MainForTests) for the tests that run a node with real
// engines, and as a node for the demo's. Every test stops the servers, clients and commands it started.
func TestMain(m *testing.M) {
	if code, ok := fakeengine.MainForTests(os.Args[1:]); ok {
		os.Exit(code)
	}
	// And as `llmgw node up`, for the demo's tests: the demo starts its
	// nodes as its own executable.
	if len(os.Args) > 2 && os.Args[1] == "node" && os.Args[2] == "up" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}
