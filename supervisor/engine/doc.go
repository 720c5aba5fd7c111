// Package engine runs this node's shards as engines: it turns the plan's
// assignments into engines started through a runtime (containerd or host
// processes), judges them ready, restarts the ones that crash, stops the
// ones no longer planned, and reports each as a shard record for gossip.
//
// It owns, per engine, one watch goroutine and the engine's files in the
// data dir: its shard state file (shards/, so a restarted agent adopts what
// is still running instead of starting it again) and its log (logs/).
//
// The files by concern, each with the type it holds:
//
//	runner.go     Runner and Config: reconcile with the plan, the records
//	desired.go    Desired and Gang, one shard the plan gives this node
//	managed.go    managed, one engine's state under the runner's lock
//	adopt.go      adoption of what an earlier agent left running
//	watch.go      the watch goroutine (watchState): start, crash, poll
//	policy.go     restartPolicy: a poll's verdict, crash counting, backoff
//	judge.go      the readiness rule (liveness) and the start clock
//	ready.go      prober: readiness probes, port ownership, load scrape
//	gang.go       gangs: gangNode (rendezvous, record), teardown, members
//	stop.go       drain and stop
//	ports.go      ports, the engine ports held
//	logs.go       engine log paths and capping
//	hosttools.go  what the host tools (containers, engine_stacks) list
//	claim.go      ClaimOnly, the runner that claims and runs nothing
//	trace.go      startTrace: the spans of engine starts and failovers
//
// Locks: Runner.mu guards the table of engines and every engine's fields
// (each managed shares it); Runner.logMu is taken before it, ports' own
// lock after it. None is held while waiting on the runtime or an engine.
package engine
