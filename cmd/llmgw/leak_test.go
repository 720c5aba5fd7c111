package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/llmgw/llmgw/supervisor/fakeengine"
)

// TestMain lets the test binary serve as the fake engine (see
// fakeengine.MainForTests) for the tests that run a node with real
// engines. Every test stops the servers, clients and commands it started.
func TestMain(m *testing.M) {
	if code, ok := fakeengine.MainForTests(os.Args[1:]); ok {
		os.Exit(code)
	}
	goleak.VerifyTestMain(m)
}
