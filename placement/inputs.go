package placement

import (
	"maps"
	"reflect"
	"slices"
)

// SameInputs reports whether Compute reads the same thing in a and b, so
// that a caller holding Compute(a) may use it for b: Compute is a pure
// function of its view, and the only field of a view it never reads is a
// GPU's MemoryUsed (it fits against MemoryForeign), which moves with every
// engine's load. Everything else is compared: nodes in order, with their
// liveness, labels, GPUs, held shards (judged leases, claims, settling)
// and cached models, and the deployments. TestSameInputsSeesEveryField
// fails when a field is added to these types and not compared here.
func SameInputs(a, b View) bool {
	return slices.EqualFunc(a.Nodes, b.Nodes, sameNode) &&
		// Deployments are few and change rarely; their specs hold maps and
		// nested settings, compared whole.
		reflect.DeepEqual(a.Deployments, b.Deployments) &&
		a.Share == b.Share && maps.Equal(a.Usage, b.Usage)
}

func sameNode(a, b Node) bool {
	return a.Name == b.Name && a.Alive == b.Alive && maps.Equal(a.Labels, b.Labels) &&
		slices.EqualFunc(a.GPUs, b.GPUs, sameGPU) && slices.EqualFunc(a.Shards, b.Shards, sameHeld) &&
		slices.Equal(a.CachedModels, b.CachedModels)
}

// sameGPU compares two GPUs but for MemoryUsed.
func sameGPU(a, b GPU) bool {
	return a.Index == b.Index && a.UUID == b.UUID && a.Name == b.Name && a.MemoryTotal == b.MemoryTotal &&
		a.MemoryForeign == b.MemoryForeign && a.MIG == b.MIG && slices.Equal(a.NVLinkPeers, b.NVLinkPeers) &&
		a.PCIBusID == b.PCIBusID && a.Faulted == b.Faulted
}

func sameHeld(a, b HeldShard) bool {
	return a.ShardID == b.ShardID && a.SpecVersion == b.SpecVersion && slices.Equal(a.GPUs, b.GPUs) &&
		a.MemoryPerGPU == b.MemoryPerGPU && a.Lease == b.Lease && a.ClaimStamp == b.ClaimStamp &&
		a.Failing == b.Failing && a.Settling == b.Settling
}
