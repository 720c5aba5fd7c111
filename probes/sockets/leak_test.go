package sockets

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test stops the servers, clients and commands it started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
