package gossip

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/llmgw/llmgw/placement"
)

// DropReason says why a record (or a whole message) was refused. Each
// refused record is counted under one reason (Stats.Drops) and the rest of
// its message is still taken.
type DropReason string

// The reasons a record is refused.
const (
	// DropMalformed: the whole message did not decode.
	DropMalformed DropReason = "malformed"
	// DropInvalidDeployment: a deployment record fails the checks of
	// POST /v1/deployments, or its name is not its spec's.
	DropInvalidDeployment DropReason = "invalid_deployment"
	// DropInvalidNode: a node record or beat that no correct node sends.
	DropInvalidNode DropReason = "invalid_node"
	// DropStampAhead: a deployment's stamp is more than MaxClockOffset
	// ahead of this node's clock.
	DropStampAhead DropReason = "stamp_ahead"
	// DropEpochAhead: a boot epoch (record, beat or memberlist meta) is
	// more than MaxClockOffset ahead of this node's clock.
	DropEpochAhead DropReason = "epoch_ahead"
)

// MaxClockOffset bounds how far ahead of this node's clock a stamp or a
// boot epoch may be and still be taken in, CockroachDB's max-offset idea.
// Witnessing a stamp moves this node's clock to it, so without a bound one
// node with a wrong clock (or one forged stamp) would drag every later
// write of the cluster ahead with it, and a stamp a year ahead would beat
// every honest write for a year.
//
// 30 s, not CockroachDB's 500 ms: llmgw orders operator writes, which are
// seconds apart, not transactions, and a loaded GPU host (or one whose NTP
// has not synced yet after boot) can be off by seconds; refusing its writes
// then would be the bigger harm. Anything synced by NTP or chrony is within
// milliseconds. A refusal is "not yet" rather than "never": the record
// arrives again with the next push/pull, and is taken once this node's
// clock is within the bound of it.
const MaxClockOffset = 30 * time.Second

// ahead reports whether t (Unix ns) lies more than MaxClockOffset after
// now.
func ahead(t int64, now time.Time) bool { return t > now.Add(MaxClockOffset).UnixNano() }

// DropReasons lists every reason, in a fixed order, so a reader can show
// each (at zero too: a vanished series is not a count that went to zero).
func DropReasons() []DropReason {
	return []DropReason{DropMalformed, DropInvalidDeployment, DropInvalidNode, DropStampAhead, DropEpochAhead}
}

// ErrInvalidRecord is wrapped by every error the record checks return.
var ErrInvalidRecord = errors.New("invalid gossip record")

// checkDeployment applies to a deployment record, from a peer or from
// deployments.json, what POST /v1/deployments applies to a spec: a node
// must not run, or make its peers run, what no API would have accepted.
// The stamp must come from a valid node and not lie beyond MaxClockOffset
// of now.
func checkDeployment(d DeploymentRecord, now time.Time) (DropReason, error) {
	bad := func(format string, args ...any) (DropReason, error) {
		return DropInvalidDeployment, fmt.Errorf("%w: deployment record %q: "+format, append([]any{ErrInvalidRecord, d.Name}, args...)...)
	}
	if err := placement.ValidateName(d.Name); err != nil {
		return bad("%w", err)
	}
	if err := ValidateNodeName(d.Stamp.Origin); err != nil {
		return bad("stamp.origin: %w", err)
	}
	if ahead(time.UnixMilli(d.Stamp.Wall).UnixNano(), now) {
		return DropStampAhead, fmt.Errorf("%w: deployment record %q: stamp.wall %s is %s ahead of this node's clock, beyond the %s bound (whose clock is wrong? see llmgw nodes)",
			ErrInvalidRecord, d.Name, time.UnixMilli(d.Stamp.Wall).UTC().Format(time.RFC3339), time.UnixMilli(d.Stamp.Wall).Sub(now).Round(time.Second), MaxClockOffset)
	}
	if d.Deleted {
		return "", nil
	}
	if d.Spec == nil {
		return bad("spec: missing on a record that is not a tombstone")
	}
	if d.Spec.Name != d.Name {
		return bad("spec.name: %q, want the record's name", d.Spec.Name)
	}
	if err := d.Spec.WithDefaults().Validate(); err != nil {
		return bad("spec.%w", err)
	}
	return "", nil
}

// checkEpoch refuses a boot epoch (Unix ns) beyond MaxClockOffset of now.
func checkEpoch(what string, epoch int64, now time.Time) (DropReason, error) {
	if ahead(epoch, now) {
		return DropEpochAhead, fmt.Errorf("%w: %s: epoch %s is %s ahead of this node's clock, beyond the %s bound",
			ErrInvalidRecord, what, time.Unix(0, epoch).UTC().Format(time.RFC3339), time.Unix(0, epoch).Sub(now).Round(time.Second), MaxClockOffset)
	}
	return "", nil
}

// checkNode checks a node record from a peer.
func checkNode(r NodeRecord, now time.Time) (DropReason, error) {
	if err := ValidateNodeName(r.Name); err != nil {
		return DropInvalidNode, fmt.Errorf("%w: node record: %w", ErrInvalidRecord, err)
	}
	return checkEpoch("node record "+r.Name+": version", r.Version.Epoch, now)
}

// checkBeat checks a renewal from a peer.
func checkBeat(b Beat, now time.Time) (DropReason, error) {
	if err := ValidateNodeName(b.Name); err != nil {
		return DropInvalidNode, fmt.Errorf("%w: beat: %w", ErrInvalidRecord, err)
	}
	return checkEpoch("beat "+b.Name+": version", b.Version.Epoch, now)
}

// maxNodeName bounds a node name; memberlist carries it in every packet.
const maxNodeName = 128

// ValidateNodeName checks a node name: 1-128 characters, no whitespace or
// control characters, and no '/', which separates name from address where
// memberlist is told whom it dials ("name/host:port").
func ValidateNodeName(name string) error {
	bad := func(want string) error {
		return &placement.FieldError{Field: "name", Value: name, Want: want}
	}
	if name == "" || len(name) > maxNodeName {
		return bad(fmt.Sprintf("a node name of 1-%d characters", maxNodeName))
	}
	if strings.IndexFunc(name, func(r rune) bool { return r == '/' || unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0 {
		return bad("a node name without spaces, control characters or '/'")
	}
	return nil
}
