package publish

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
)

// Kernel lines are made to fit the record: printable and cut.
func TestFaultLineFitsTheRecord(t *testing.T) {
	long := "NVRM: " + strings.Repeat("é", gossip.MaxFaultLine)
	got := FaultLine(long)
	if len(got) > gossip.MaxFaultLine || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Errorf("cut to %d bytes, valid %v: %q", len(got), utf8.ValidString(got), got)
	}
	if got := FaultLine("NVRM: \x1b[2Jbad\tline"); got != "NVRM:  [2Jbad line" {
		t.Errorf("control characters kept: %q", got)
	}
}

// GPU memory that moves less than 256 MiB is not news; a fault, or a
// probe summary with another fault time, is.
func TestHardwarePublishesOnlyWhatChanged(t *testing.T) {
	rec := &record{}
	h := NewHardware(rec)
	gpus := []placement.GPU{{UUID: "GPU-a", MemoryTotal: 80 << 30, MemoryUsed: 1 << 30}}
	if !h.Publish(rec.Local(), gpus, gossip.ProbeSummary{}, nil) {
		t.Fatal("the first reading was not published")
	}
	wobble := []placement.GPU{{UUID: "GPU-a", MemoryTotal: 80 << 30, MemoryUsed: 1<<30 + 100<<20}}
	if h.Publish(rec.Local(), wobble, gossip.ProbeSummary{}, nil) {
		t.Fatal("a 100 MiB wobble was published")
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	faulted := gossip.ProbeSummary{DriverFaultsRecent: 1, LastDriverFaultAt: at}
	if !h.Publish(rec.Local(), wobble, faulted, nil) {
		t.Fatal("a new driver fault was not published")
	}
	// The same instant in another location is the same summary.
	elsewhere := faulted
	elsewhere.LastDriverFaultAt = at.In(time.FixedZone("X", 3600))
	if h.Publish(rec.Local(), wobble, elsewhere, nil) {
		t.Fatal("the same fault time in another zone was published")
	}
	tel := gossip.Telemetry{ReadAt: at}
	if !h.Publish(rec.Local(), wobble, elsewhere, &tel) || !rec.r.Telemetry.ReadAt.Equal(at) || rec.updates != 3 {
		t.Fatalf("a telemetry reading: %d updates, telemetry %+v", rec.updates, rec.r.Telemetry)
	}
}
