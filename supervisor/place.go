package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/llmgw/llmgw/gossip"
	"github.com/llmgw/llmgw/placement"
	"github.com/llmgw/llmgw/supervisor/status"
)

// ErrNoDeployment is returned (wrapped) by Unplace for a name that no live
// deployment has.
var ErrNoDeployment = errors.New("no such deployment")

// Place makes spec the cluster's newest wish for its name: validated,
// persisted here, then gossiped. It is the one way in for every interface
// (the HTTP API, MCP), so each gets the same checks. An invalid spec is an
// error wrapping placement.ErrInvalidDeployment and changes nothing. ctx
// bounds what Place asks of others (a gpu_memory: auto spec's headers,
// from a peer or the hub); the caller going away ends it.
//
// The answer says what runs already when the spec's version is running
// (only replicas, or nothing, changed), and zeros for a new version.
func (n *Node) Place(ctx context.Context, spec placement.Deployment) (status.DeploymentInfo, error) {
	if err := knownToCluster(spec, n.cluster.ActiveVersion()); err != nil {
		return status.DeploymentInfo{}, err
	}
	spec, err := n.resolveAuto(ctx, spec)
	if err != nil {
		return status.DeploymentInfo{}, err
	}
	if err := spec.WithDefaults().Validate(); err != nil {
		return status.DeploymentInfo{}, fmt.Errorf("%w: %w", placement.ErrInvalidDeployment, err)
	}
	old, known := n.cluster.Deployment(spec.Name)
	if a := spec.Autoscale; a != nil && known && !old.Deleted && old.Spec != nil {
		// Placed again, an autoscaled deployment starts where it stands:
		// the new spec's stamp voids the old targets, and its start
		// replicas are what every node places until its decider writes.
		for _, d := range n.Status().Deployments(n.clock.Now()) {
			if d.Name == spec.Name {
				spec.Replicas = min(max(d.Replicas, a.Min), a.Max)
			}
		}
	}
	change := changeOf(old, known, spec)
	rec, err := n.cluster.PutDeployment(spec)
	if err != nil {
		return status.DeploymentInfo{}, fmt.Errorf("store deployment %s: %w", spec.Name, err)
	}
	n.log.Info("deployment placed", "name", spec.Name, "model", spec.Model, "replicas", spec.Replicas, "spec_version", spec.SpecVersion())
	// What this node shows from now on has seen the write.
	n.reads.awaitWrite()
	info := status.DeploymentInfo{Deployment: spec, SpecVersion: spec.SpecVersion(), Stamp: rec.Stamp, Nodes: []string{}, Change: change}
	for _, d := range n.Status().Deployments(n.clock.Now()) {
		if d.Name == spec.Name && d.SpecVersion == info.SpecVersion {
			// The plan computed with this write: how much of it can be
			// placed now, and placement's reasons for the rest.
			info.Placed, info.Ready, info.Nodes, info.Why = min(d.Placed, spec.Replicas), min(d.Ready, spec.Replicas), d.Nodes, d.Why
		}
	}
	return info, nil
}

// knownToCluster refuses a spec that sets a field the cluster's active
// protocol version does not know: a node of an older release in the
// cluster would decode the spec without it, run the deployment without it
// and relay its stripped copy. Such a field is accepted once the version
// that knows it is active, which is once every node runs a release that
// speaks it. The error wraps placement.ErrInvalidDeployment (the request
// is refused with 400, as other bad specs).
func knownToCluster(spec placement.Deployment, active int) error {
	newer := spec.FieldsAbove(active)
	if len(newer) == 0 {
		return nil
	}
	var what, fields []string
	need := 0
	for _, f := range newer {
		what = append(what, fmt.Sprintf("%s needs cluster protocol %d", f.Field, f.Protocol))
		fields = append(fields, f.Field)
		need = max(need, f.Protocol)
	}
	return fmt.Errorf("%w: %s (the cluster runs protocol %d until every node runs an llmgw that speaks protocol %d, as this one does); leave %s out until then",
		placement.ErrInvalidDeployment, strings.Join(what, ", "), active, need, strings.Join(fields, " and "))
}

// sameSpec reports whether a and b are the same spec after defaults,
// field for field (json.Marshal writes maps sorted, as SpecVersion's hash
// relies on too).
func sameSpec(a, b placement.Deployment) bool {
	ja, errA := json.Marshal(a.WithDefaults())
	jb, errB := json.Marshal(b.WithDefaults())
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

// changeOf says what placing spec does to old, the record of its name
// as this node knows it (known: there is one).
func changeOf(old gossip.DeploymentRecord, known bool, spec placement.Deployment) string {
	switch {
	case !known || old.Deleted || old.Spec == nil:
		return status.ChangeNew
	case old.Spec.WithDefaults().SpecVersion() != spec.WithDefaults().SpecVersion():
		return status.ChangeChanged
	case old.Spec.WithDefaults().Replicas != spec.WithDefaults().Replicas:
		return status.ChangeScaled
	case !sameSpec(*old.Spec, spec):
		return status.ChangeSettings
	}
	return status.ChangeUnchanged
}

// Unplace replaces the deployment name with a tombstone, everywhere. A
// name no live deployment has is an error wrapping ErrNoDeployment.
func (n *Node) Unplace(name string) error {
	_, ok, err := n.cluster.DeleteDeployment(name)
	switch {
	case err != nil:
		return fmt.Errorf("remove deployment %s: %w", name, err)
	case !ok:
		return fmt.Errorf("%w named %q", ErrNoDeployment, name)
	}
	n.log.Info("deployment removed", "name", name)
	n.reads.awaitWrite()
	return nil
}
