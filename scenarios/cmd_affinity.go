package scenarios

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// cmdAffinity checks that gateways agree without talking to each other:
// every tenant's requests (one system prompt each, a question of every
// request's own) go through each of the given nodes' gateways in turn, one
// at a time, and each answer's Llmgw-Replica header says where the gateway
// sent it. With the prefix policy and the same view, every gateway picks
// the same replica for a tenant.
func (r *runner) cmdAffinity(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	dep, err := d.need("deployment")
	if err != nil {
		return "", time.Time{}, err
	}
	refs, ok := d.list("via")
	if !ok || len(refs) < 2 {
		return "", time.Time{}, usagef("affinity: via=(NODES) names at least two nodes whose gateways to compare")
	}
	tenants, err := d.integer("tenants", 8)
	if err != nil {
		return "", time.Time{}, err
	}
	rounds, err := d.integer("rounds", 2)
	if err != nil {
		return "", time.Time{}, err
	}
	if tenants < 1 || rounds < 1 {
		return "", time.Time{}, usagef("affinity: tenants= and rounds= must be at least 1")
	}
	nodes, _, err := r.resolveNodes(r.ctx, refs)
	if err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	agree, sent, replicas := 0, 0, map[string]bool{}
	for t := range tenants {
		chosen := map[string]bool{}
		for round := range rounds {
			for _, n := range nodes {
				rep, err := r.tenantRequest(n.gateway(), dep, t, sent)
				sent++
				if err != nil {
					return fmt.Sprintf("tenant %d, round %d, %s's gateway: %v", t, round+1, n.name, err), at, nil
				}
				chosen[rep] = true
				replicas[rep] = true
			}
		}
		if len(chosen) == 1 {
			agree++
		}
	}
	r.res.Notes = append(r.res.Notes, fmt.Sprintf("affinity: %d/%d tenants on one replica through %d gateways, %d replicas used, %d requests",
		agree, tenants, len(nodes), len(replicas), sent))
	return fmt.Sprintf("%d tenants through %d gateways, %d rounds: the same replica for %d of %d", tenants, len(nodes), rounds, agree, tenants), at, nil
}

// tenantRequest sends tenant t's request number i and returns the replica
// that answered.
func (r *runner) tenantRequest(gatewayURL, deployment string, t, i int) (string, error) {
	system := fmt.Sprintf("You are the assistant of tenant %d. %s", t, strings.Repeat(fmt.Sprintf("Tenant %d's house rules. ", t), 40))
	b, _ := json.Marshal(map[string]any{
		"model":      deployment,
		"max_tokens": 2,
		"messages": []map[string]string{
			{"role": "system", "content": system},
			{"role": "user", "content": fmt.Sprintf("question %d", i)},
		},
	})
	req, err := http.NewRequestWithContext(r.ctx, http.MethodPost, gatewayURL+"/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	rep := resp.Header.Get("Llmgw-Replica")
	if rep == "" {
		return "", fmt.Errorf("no Llmgw-Replica header")
	}
	return rep, nil
}
