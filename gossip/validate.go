package gossip

import (
	"errors"
	"fmt"
	"strings"
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
)

// DropReasons lists every reason, in a fixed order, so a reader can show
// each (at zero too: a vanished series is not a count that went to zero).
func DropReasons() []DropReason {
	return []DropReason{DropMalformed, DropInvalidDeployment, DropInvalidNode}
}

// ErrInvalidRecord is wrapped by every error the record checks return.
var ErrInvalidRecord = errors.New("invalid gossip record")

// checkDeployment applies to a deployment record, from a peer or from
// deployments.json, what POST /v1/deployments applies to a spec: a node
// must not run, or make its peers run, what no API would have accepted.
func checkDeployment(d DeploymentRecord) error {
	if err := placement.ValidateName(d.Name); err != nil {
		return fmt.Errorf("%w: deployment record %q: %w", ErrInvalidRecord, d.Name, err)
	}
	if d.Deleted {
		return nil
	}
	if d.Spec == nil {
		return fmt.Errorf("%w: deployment record %q: spec: missing on a record that is not a tombstone", ErrInvalidRecord, d.Name)
	}
	if d.Spec.Name != d.Name {
		return fmt.Errorf("%w: deployment record %q: spec.name: %q, want the record's name", ErrInvalidRecord, d.Name, d.Spec.Name)
	}
	if err := d.Spec.WithDefaults().Validate(); err != nil {
		return fmt.Errorf("%w: deployment record %q: spec.%w", ErrInvalidRecord, d.Name, err)
	}
	return nil
}

// checkNode checks a node record from a peer.
func checkNode(r NodeRecord) error {
	if err := ValidateNodeName(r.Name); err != nil {
		return fmt.Errorf("%w: node record: %w", ErrInvalidRecord, err)
	}
	return nil
}

// checkBeat checks a renewal from a peer.
func checkBeat(b Beat) error {
	if err := ValidateNodeName(b.Name); err != nil {
		return fmt.Errorf("%w: beat: %w", ErrInvalidRecord, err)
	}
	return nil
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
