// Package gossip replicates llmgw's small cluster state over memberlist:
// one NodeRecord per node (single writer, versioned), deployments
// (last-writer-wins on a hybrid logical clock, tombstones for deletions) and
// the leases that live inside node records.
//
// Deltas travel as named broadcasts, so a newer delta for the same key
// replaces an older queued one; anything larger than half a UDP packet goes
// to every member over TCP (SendReliable) instead, because memberlist never
// sends a broadcast that does not fit a packet. Push/pull exchanges the whole
// state and repairs whatever broadcasts were lost.
//
// Where each part lives:
//   - cluster.go: Config, the Cluster, New/Join/Leave/Shutdown and the API
//     the supervisor calls (UpdateLocal, Renew, PutDeployment, Members,
//     Stats).
//   - delegate.go, event_delegate.go, ping_delegate.go, alive_delegate.go:
//     one adapter per memberlist callback interface (messages and
//     push/pull; membership events; probe acks carrying wall time; alive
//     messages, refused from a peer that cannot speak the cluster
//     version), each wrapping the Cluster.
//   - version.go: the cluster version, the protocol version every node
//     runs at (ActiveVersion), and the peers it refuses.
//   - send.go: how deltas leave (named broadcasts, reliable sends, relays);
//     receive.go: how a peer's message is checked, merged and refused.
//   - store.go: the replicated state and its merge rules; record.go: the
//     records; hlc.go: the hybrid logical clock stamping deployments;
//     codec.go: the wire format; validate.go: the checks every record from
//     a peer (or from disk) passes, and why one is dropped.
//   - persist.go: deployments.json and tombstone collection.
//   - clock.go: each node's estimate of its clock's offset from the
//     cluster's; contact.go: when a peer was last heard, and join errors.
//   - profile.go: memberlist timings; logadapter.go: memberlist's log in
//     slog; drop.go: the test-only partition transport.
//
// Time that judges records (stamps, epochs, TTLs, tombstone collection) is
// read from Config.Clock; memberlist's own timers run on real time.
package gossip
