package profile

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/llmgw/llmgw/placement"
)

// What an engine's memory flag is a fraction of (Profile.MemoryFraction).
const (
	// FractionOfTotal: a fraction of the GPU's total memory that bounds
	// everything the engine allocates (vLLM's --gpu-memory-utilization).
	// The default.
	FractionOfTotal = "total"
	// FractionOfFreeStatic: a fraction of the memory free when the engine
	// starts that covers its weights and KV cache only, its activations
	// and CUDA graphs coming on top (SGLang's --mem-fraction-static).
	FractionOfFreeStatic = "free_static"
)

const mib = 1 << 20

// sglangReserved is the memory SGLang keeps outside its static pool
// (weights and KV) for activations and CUDA graphs, in bytes, by SGLang's
// own estimate: ServerArgs._handle_gpu_memory_settings in
// python/sglang/srt/server_args.py (read in a 0.5-series tree; llmgw pins
// v0.5.9, PinnedSGLangImage), which derives its
// default --mem-fraction-static as (gpu_mem − reserved_mem) / gpu_mem with,
// in MiB, reserved_mem = 512 (attention metadata) + max(chunked_prefill_size,
// 2048) × 1.5 (prefill activations) + cuda_graph_max_bs × 2 (CUDA graphs)
// + tp_size × pp_size / 8 × 1024, at least 10 GiB on GPUs above 60 GiB.
// chunked_prefill_size and cuda_graph_max_bs are SGLang's defaults for the
// GPU's total memory and TP, which llmgw does not override. The terms for
// DP attention, speculative decoding and piecewise graphs are left out:
// llmgw passes none of those flags (a deployment's args that do are the
// operator's to size).
func sglangReserved(total uint64, tp, pp int) uint64 {
	gpuMiB := total / mib
	var prefill, graphBS uint64
	switch {
	case gpuMiB < 20*1024: // T4, 4080
		prefill, graphBS = 2048, 8
	case gpuMiB < 35*1024: // A10, 4090, 5090
		prefill, graphBS = 2048, 24
		if tp >= 4 {
			graphBS = 80
		}
	case gpuMiB < 60*1024: // A100 40GB, L40
		prefill, graphBS = 4096, 32
		if tp >= 4 {
			graphBS = 160
		}
	case gpuMiB < 160*1024: // H100, A100 80GB, H20, H200
		prefill, graphBS = 8192, 256
		if tp >= 4 {
			graphBS = 512
		}
	default: // B200, MI300
		prefill, graphBS = 16384, 512
	}
	// In MiB × 8, to keep tp × pp / 8 × 1024 and the 1.5 factor exact.
	r8 := 512*8 + max(prefill, 2048)*12 + graphBS*16 + uint64(tp*pp)*1024
	r := r8 * mib / 8
	if gpuMiB > 60*1024 {
		r = max(r, 10*1024*mib)
	}
	return r
}

// sglangBalance is SGLang's own TP memory check, made before the engine
// starts so the shard says why rather than the engine's log:
// ModelRunner.init_torch_distributed (python/sglang/srt/model_executor/
// model_runner.py) takes the minimum free memory across the ranks and
// raises "The memory capacity is unbalanced" on a rank whose own free
// memory × 0.9 exceeds it, so every GPU must have min ≥ 0.9 × its free.
func sglangBalance(free []uint64) error {
	lo, hi := slices.Min(free), slices.Max(free)
	if lo*10 < hi*9 {
		return fmt.Errorf("free memory on the shard's GPUs is unbalanced (%s to %s; SGLang refuses TP when one GPU has less than 90%% of another's): other processes use some of them",
			placement.Bytes(lo), placement.Bytes(hi))
	}
	return nil
}

// sglangFraction is --mem-fraction-static for a share of want bytes per
// GPU: SGLang's static pool is the fraction × the memory free before it
// loads (python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py:
// the KV cache gets post-load free − pre-load free × (1 − fraction)), and
// its activations and CUDA graphs come on top, so the fraction is
// (share − reserved) / free now. SGLang sizes by the minimum free memory
// across its TP ranks (get_available_gpu_memory with distributed=True
// all-reduces the minimum), so free is the smallest reading. Two decimals,
// rounded down, as utilization.
func sglangFraction(want, total uint64, free []uint64, tp, pp int) (string, error) {
	if len(free) == 0 {
		return "", fmt.Errorf("no free-memory reading of the shard's GPUs")
	}
	if len(free) > 1 {
		if err := sglangBalance(free); err != nil {
			return "", err
		}
	}
	lo := slices.Min(free)
	if lo < want {
		return "", fmt.Errorf("gpu_memory %s exceeds the %s free now on the shard's GPU(s): other processes use the rest; not starting", placement.Bytes(want), placement.Bytes(lo))
	}
	reserved := sglangReserved(total, tp, pp)
	if want <= reserved {
		return "", fmt.Errorf("gpu_memory %s leaves nothing for weights and KV cache after the %s SGLang keeps for activations and CUDA graphs on this GPU: raise gpu_memory", placement.Bytes(want), placement.Bytes(reserved))
	}
	hundredths := (want - reserved) * 100 / lo
	if hundredths == 0 {
		return "", fmt.Errorf("gpu_memory %s is under 1%% of the %s free after SGLang's %s for activations and CUDA graphs: raise gpu_memory", placement.Bytes(want), placement.Bytes(lo), placement.Bytes(reserved))
	}
	return strconv.FormatFloat(float64(hundredths)/100, 'f', 2, 64), nil
}
