// Package engine runs this node's shards as engines: it turns the plan's
// assignments into engines started through a runtime (containerd or host
// processes), judges them ready, restarts the ones that crash, stops the
// ones no longer planned, and reports each as a shard record for gossip.
//
// It owns, per engine, one watch goroutine and the engine's files in the
// data dir: its shard state file (shards/, so a restarted agent adopts what
// is still running instead of starting it again) and its log (logs/).
//
// The files by concern:
//
//	runner.go     Runner and Config: reconcile with the plan, the records
//	desired.go    Desired, one shard the plan gives this node
//	managed.go    one engine's state under Runner.mu
//	adopt.go      adoption of what an earlier agent left running
//	watch.go      the watch goroutine: start, crash and backoff, stop
//	ready.go      readiness, port ownership, the /metrics load scrape
//	ports.go      engine port allocation
//	logs.go       engine log paths and capping
//	hosttools.go  what the host tools (containers, engine_stacks) list
//	claim.go      ClaimOnly, the runner that claims and runs nothing
package engine
