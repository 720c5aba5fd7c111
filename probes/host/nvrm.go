package host

import (
	"regexp"
)

// Which NVRM lines are faults.
//
// The driver says a lot that is not wrong: the module's load banner, an
// interrupt it cleared at boot, a deprecation notice (all three are on the
// healthy H200 fixture). Counting those as faults would mark every node
// with an NVIDIA driver faulty after each boot. What the driver prints
// when it is in trouble has a few fixed shapes: a status code of its own
// (NV_ERR_*, as in "Check failed: Out of memory [NV_ERR_NO_MEMORY]", the
// line the seed's node logged every few minutes for 23 minutes before it
// had to be power-cycled), a GPU that fell off the bus, an adapter that
// failed to initialise, a failed assertion, a client/module version
// mismatch. Xid lines are always faults; they are the driver's own error
// reports.
var (
	// benignNVRM is checked first: notices whose words could look like a
	// fault ("failed" in a deprecation note) are never one.
	benignNVRM = regexp.MustCompile(`(?i)loading NVIDIA .*Kernel Module|Interrupt detected|is deprecated|will be removed in a future release|persistence mode is (?:enabled|disabled)`)
	faultNVRM  = regexp.MustCompile(`(?i)NV_ERR_[A-Z0-9_]+|fallen off the bus|lost from the bus|GPU is lost|RmInitAdapter failed|rm_init_adapter failed|failed to initiali[sz]e|initiali[sz]ation failed|Cannot attach gpu|Assertion failed|API mismatch|uncorrectable|Failed to allocate|RmRcWatchdog|GPU has been detected as hung|not supported by the NVIDIA`)
)

// isFaultLine reports whether a driver line (its message, without the
// timestamp) is a fault: an Xid, or an NVRM line of a fault's shape.
func isFaultLine(msg string, xid int) bool {
	if xid != 0 {
		return true
	}
	if benignNVRM.MatchString(msg) {
		return false
	}
	return faultNVRM.MatchString(msg)
}
