package scenarios

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/llmgw/llmgw/placement/fit/fittest"
	"github.com/llmgw/llmgw/probes/weights/weightstest"
)

// families are the header-only models the weights command can write.
func families() map[string]func() fittest.Family {
	return map[string]func() fittest.Family{
		"llama-3.1-8b":      fittest.Llama31_8B,
		"llama-3.1-8b-fp8":  fittest.Llama31_8B_FP8,
		"qwen2.5-7b-awq":    fittest.Qwen25_7B_AWQ,
		"gemma-2-9b":        fittest.Gemma2_9B,
		"mixtral-8x7b":      fittest.Mixtral8x7B,
		"llama-3.1-8b-q4km": fittest.Llama31_8B_Q4KM,
	}
}

// cmdWeights writes a header-only model into a node's weights dir: as the
// hub cache lays out model=ORG/NAME, as a plain directory model=NAME, or
// as a .gguf file for a GGUF family.
func (r *runner) cmdWeights(d *directive) (string, time.Time, error) {
	if err := r.needCluster(d); err != nil {
		return "", time.Time{}, err
	}
	ref, err := d.nextPos("node")
	if err != nil {
		return "", time.Time{}, err
	}
	ns, _, err := r.resolveNodes(r.ctx, []string{ref})
	if err != nil {
		return "", time.Time{}, err
	}
	fam, err := d.need("family")
	if err != nil {
		return "", time.Time{}, err
	}
	if fam == loraAdapterFamily {
		return r.writeAdapter(d, ns)
	}
	mk, ok := families()[fam]
	if !ok {
		names := make([]string, 0, len(families()))
		for k := range families() {
			names = append(names, k)
		}
		names = append(names, loraAdapterFamily)
		slices.Sort(names)
		return "", time.Time{}, usagef("weights: family %q: want one of %s", fam, strings.Join(names, ", "))
	}
	f := mk()
	model, err := d.str("model", f.Dir)
	if err != nil {
		return "", time.Time{}, err
	}
	at := time.Now()
	for _, n := range ns {
		dir := n.weightsDir()
		switch {
		case f.GGUF != nil:
			err = weightstest.WriteGGUF(filepath.Join(dir, model), f)
		case strings.Contains(model, "/"):
			_, err = weightstest.WriteHubCache(dir, model, f, 2)
		default:
			err = weightstest.WriteDir(filepath.Join(dir, model), f, 2)
		}
		if err != nil {
			return "", at, fmt.Errorf("weights %s: %w", n.name, err)
		}
	}
	return "ok", at, nil
}

// condCached: every observer sees model in node's cached models.
func (r *runner) condCached(obs []*node, node, model string) (bool, string) {
	infos, errs := fetchAll[clusterInfo](r.ctx, r, obs, "/v1/cluster")
	if err := firstErr(obs, errs); err != nil {
		return false, err.Error()
	}
	for i, ci := range infos {
		found := false
		for _, m := range ci.Members {
			if m.Name == node && slices.ContainsFunc(m.CachedModels, func(c cachedModel) bool { return c.Model == model }) {
				found = true
			}
		}
		if !found {
			return false, fmt.Sprintf("%s does not see %s cached on %s", obs[i].name, model, node)
		}
	}
	return true, ""
}

// loraAdapterFamily is the weights command's LoRA adapter: a directory
// model=NAME (a path in the weights dir) holding a PEFT adapter_config.json
// of rank 8, which is what an engine reads first of an adapter.
const loraAdapterFamily = "lora-adapter"

func (r *runner) writeAdapter(d *directive, ns []*node) (string, time.Time, error) {
	model, err := d.need("model")
	if err != nil {
		return "", time.Time{}, err
	}
	if strings.Contains(model, "..") || filepath.IsAbs(model) {
		return "", time.Time{}, usagef("weights: model %q: want a path inside the weights dir", model)
	}
	at := time.Now()
	for _, n := range ns {
		dir := filepath.Join(n.weightsDir(), filepath.FromSlash(model))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", at, fmt.Errorf("weights %s: %w", n.name, err)
		}
		cfg := `{"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}` + "\n"
		if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(cfg), 0o644); err != nil {
			return "", at, fmt.Errorf("weights %s: %w", n.name, err)
		}
	}
	return "ok", at, nil
}
