package overview

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no reader leaves a goroutine behind once what it
// waited on has answered: a section past its bound is abandoned, not
// leaked for good.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
