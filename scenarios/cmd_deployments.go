package scenarios

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"
)

// viaNode is the node a deployment is sent to: via=NODE, else the first
// observer.
func (r *runner) viaNode(d *directive) (*node, error) {
	if ref, ok := d.kvRaw("via"); ok {
		ns, _, err := r.resolveNodes(r.ctx, []string{ref})
		if err != nil {
			return nil, err
		}
		return ns[0], nil
	}
	obs := r.observers(nil)
	if len(obs) == 0 {
		return nil, errors.New("no node is up")
	}
	return obs[0], nil
}

func (r *runner) cmdPlace(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	name, err := d.nextPos("deployment name")
	if err != nil {
		return "", time.Time{}, err
	}
	spec := map[string]any{"name": name}
	model, err := d.need("model")
	if err != nil {
		return "", time.Time{}, err
	}
	spec["model"] = model
	if spec["engine"], err = d.str("engine", "fake"); err != nil {
		return "", time.Time{}, err
	}
	if v, ok := d.kvRaw("tp"); ok && v == "auto" {
		spec["tensor_parallel"] = "auto"
	}
	for key, field := range map[string]string{"replicas": "replicas", "tp": "tensor_parallel", "pp": "pipeline_parallel", "max-model-len": "max_model_len", "max-num-seqs": "max_num_seqs"} {
		if d.has(key) && spec[field] == nil {
			v, err := d.integer(key, 0)
			if err != nil {
				return "", time.Time{}, err
			}
			spec[field] = v
		}
	}
	// min-replicas and max-replicas are sent as replicas: {min, max};
	// target-inflight and scale-down-delay go with them.
	if d.has("min-replicas") || d.has("max-replicas") {
		rng := map[string]any{}
		for key, field := range map[string]string{"min-replicas": "min", "max-replicas": "max"} {
			v, err := d.integer(key, 0)
			if err != nil {
				return "", time.Time{}, err
			}
			rng[field] = v
		}
		spec["replicas"] = rng
	}
	if kvs, ok := d.list("adapters"); ok {
		var ads []map[string]string
		for _, kv := range kvs {
			name, src, ok := strings.Cut(kv, "=")
			if !ok {
				return "", time.Time{}, usagef("adapters: %q: want name=source", kv)
			}
			ads = append(ads, map[string]string{"name": name, "source": src})
		}
		spec["adapters"] = ads
	}
	for key, field := range map[string]string{"target-inflight": "target_inflight", "priority": "priority", "max-loras": "max_loras", "max-lora-rank": "max_lora_rank"} {
		if d.has(key) {
			v, err := d.integer(key, 0)
			if err != nil {
				return "", time.Time{}, err
			}
			spec[field] = v
		}
	}
	for key, field := range map[string]string{"gpu-memory": "gpu_memory", "gpu-type": "gpu_type", "update": "update", "start-timeout": "start_timeout", "scale-down-delay": "scale_down_delay", "idle-window": "idle_window"} {
		if d.has(key) {
			if spec[field], err = d.str(key, ""); err != nil {
				return "", time.Time{}, err
			}
		}
	}
	// Prefill and decode roles: {replicas, tp} each, and the gateways'
	// P/D settings in transfer.
	for _, role := range []string{"prefill", "decode"} {
		if !d.has(role + "-replicas") {
			continue
		}
		n, err := d.integer(role+"-replicas", 0)
		if err != nil {
			return "", time.Time{}, err
		}
		rs := map[string]any{"replicas": n}
		if d.has(role + "-tp") {
			if rs["tp"], err = d.integer(role+"-tp", 0); err != nil {
				return "", time.Time{}, err
			}
		}
		spec[role] = rs
	}
	transfer := map[string]any{}
	if d.has("pd-fallback") {
		if transfer["fallback"], err = d.boolean("pd-fallback", false); err != nil {
			return "", time.Time{}, err
		}
	}
	if d.has("pd-skip-below") {
		if transfer["skip_below"], err = d.integer("pd-skip-below", 0); err != nil {
			return "", time.Time{}, err
		}
	}
	if len(transfer) > 0 {
		spec["transfer"] = transfer
	}
	if args, ok := d.list("args"); ok {
		spec["args"] = args
	}
	for key, field := range map[string]string{"labels": "labels", "env": "env"} {
		if kvs, ok := d.list(key); ok {
			m := map[string]string{}
			for _, kv := range kvs {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return "", time.Time{}, usagef("%s: %q: want k=v", key, kv)
				}
				m[k] = v
			}
			spec[field] = m
		}
	}
	n, err := r.viaNode(d)
	if err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	if err := r.call(r.ctx, "POST", n.api()+"/v1/deployments", spec, true, nil); err != nil {
		return "", at, err
	}
	return "ok", at, nil
}

func (r *runner) cmdUnplace(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	name, err := d.nextPos("deployment name")
	if err != nil {
		return "", time.Time{}, err
	}
	n, err := r.viaNode(d)
	if err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	if err := r.call(r.ctx, "DELETE", n.api()+"/v1/deployments/"+name, nil, true, nil); err != nil {
		return "", at, err
	}
	return "ok", at, nil
}

func (r *runner) cmdCrashEngine(d *directive) (string, time.Time, error) {
	shard, row, err := r.engineRow(d)
	if err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	if err := syscall.Kill(row.PID, syscall.SIGKILL); err != nil {
		return "", at, fmt.Errorf("kill the engine of %s: %w", shard, err)
	}
	return "killed the engine of " + shard + " (SIGKILL)", at, nil
}

// engineRow reads the SHARD argument and finds that shard's engine in the
// first observer's /v1/shards: the row with a pid, not draining, whose
// pid is an engine of this run (with runtime=process).
func (r *runner) engineRow(d *directive) (string, shardRow, error) {
	if err := r.needCluster(d); err != nil {
		return "", shardRow{}, err
	}
	shard, err := d.nextPos("shard")
	if err != nil {
		return "", shardRow{}, err
	}
	obs := r.observers(nil)
	if len(obs) == 0 {
		return shard, shardRow{}, errors.New("no node is up")
	}
	var rows []shardRow
	if err := r.get(r.ctx, obs[0], "/v1/shards", &rows); err != nil {
		return shard, shardRow{}, err
	}
	var found shardRow
	for _, row := range rows {
		if row.ShardID == shard && row.PID > 0 && !row.Draining {
			found = row
		}
	}
	if found.PID == 0 {
		return shard, shardRow{}, fmt.Errorf("%s has no engine pid in /v1/shards (runtime %s)", shard, r.cfg.runtime)
	}
	if _, ok := engineProcs(r.binaryPaths()...)[found.PID]; !ok && r.cfg.runtime == "process" {
		return shard, shardRow{}, fmt.Errorf("%s: pid in /v1/shards is not an engine of this run", shard)
	}
	return shard, found, nil
}

// cmdHangEngine makes a shard's engine hang: POST /debug/hang on its port,
// with the engine's key. The fake engine then answers nothing more (its
// health, metrics and streams stall) while its process runs on.
func (r *runner) cmdHangEngine(d *directive) (string, time.Time, error) {
	shard, row, err := r.engineRow(d)
	if err != nil {
		return "", time.Time{}, err
	}
	if row.URL == "" {
		return "", time.Time{}, fmt.Errorf("%s has no engine URL in /v1/shards", shard)
	}
	if _, ok := d.kvRaw("as"); ok {
		if _, ok := r.byName[row.Node]; !ok {
			return "", time.Time{}, fmt.Errorf("%s runs on %s, a node this scenario did not start", shard, row.Node)
		}
		if err := r.alias(d, row.Node); err != nil {
			return "", time.Time{}, err
		}
	}
	at := time.Now()
	if err := r.callWith(r.ctx, "POST", strings.TrimRight(row.URL, "/")+"/debug/hang", nil, r.engineKey(row), nil); err != nil {
		return "", at, fmt.Errorf("hang the engine of %s: %w", shard, err)
	}
	return "hung the engine of " + shard + " (POST /debug/hang)", at, nil
}
