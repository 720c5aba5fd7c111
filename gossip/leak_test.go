package gossip

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test stops what it started: memberlist's listeners, our senders and
// the persist loop end with Shutdown.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
