package scenarios

import (
	"fmt"
	"strconv"
)

// clusterVersionCondition parses "cluster-version N": every observer's
// /v1/cluster says the node runs at cluster protocol version N. An agent
// from before cluster versions says none and never holds it.
func (r *runner) clusterVersionCondition(args []string) (cond, error) {
	if len(args) != 1 {
		return nil, usagef("wait-until cluster-version: want one version, such as cluster-version 2")
	}
	want, err := strconv.Atoi(args[0])
	if err != nil || want < 1 {
		return nil, usagef("wait-until cluster-version %s: want a version of 1 or more", args[0])
	}
	return func(obs []*node) (bool, string) {
		type versionJSON struct {
			ActiveVersion int `json:"active_version"`
		}
		infos, errs := fetchAll[versionJSON](r.ctx, r, obs, "/v1/cluster")
		if err := firstErr(obs, errs); err != nil {
			return false, err.Error()
		}
		for i, ci := range infos {
			switch {
			case ci.ActiveVersion == 0:
				return false, obs[i].name + " reports no cluster version (an agent from before cluster versions)"
			case ci.ActiveVersion != want:
				return false, fmt.Sprintf("%s runs at cluster version %d", obs[i].name, ci.ActiveVersion)
			}
		}
		return true, ""
	}, nil
}
