// Package publish decides what goes out in this node's gossip record, and
// when. Every change of the record's content is a whole record sent to
// every node, and every node reconciles on it, so what churns (engine
// load, gateway rates, GPU memory, telemetry) goes out rounded, spaced, or
// only once it moved enough to matter to a reader.
//
// The node's loops gather the readings; the two publishers here hold when
// each part last went out and write the record:
//   - Load (load.go) is the control loop's: the shards this node holds,
//     with their engines' load, and its gateway's request rates.
//   - Hardware (hardware.go) is the GPU loop's: the GPUs, the probe
//     summary with the driver faults, and telemetry.
//
// Each is owned by its one loop and takes no lock. The package imports
// neither the node (supervisor) nor the gateway: the gateway's rates come
// in as a function.
package publish

import (
	"time"

	"github.com/llmgw/llmgw/gossip"
)

// Record is this node's own gossip record (*gossip.Cluster): what a
// publisher compares with and updates.
type Record interface {
	Local() gossip.NodeRecord
	UpdateLocal(fn func(r *gossip.NodeRecord)) gossip.NodeRecord
}

// LoadInterval spaces record updates that only carry new engine load or
// telemetry: load changes at every scrape, utilisation and power at every
// sample.
const LoadInterval = 15 * time.Second

// RatesInterval is the least time between two record updates for the
// gateway's rates.
const RatesInterval = 2 * time.Second
