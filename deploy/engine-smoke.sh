#!/usr/bin/env bash
# Manual GPU smoke test of the engine images llmgw pins
# (supervisor/profile/pinned.go). Not run in CI: it needs an NVIDIA GPU, a
# driver new enough for each image (README, "What llmgw passes to each
# engine"), docker with the NVIDIA container toolkit, the images (pulled
# or imported), and a tiny model on local disk.
#
# For each engine it starts the pinned image on one GPU with a tiny model,
# waits for /health, checks that /v1/models lists the served name, asks
# for one completion, and diffs the engine's own --help against the
# accepted-flags list the tests check the profiles against
# (supervisor/profile/testdata/flags/<engine>.txt): a line starting with
# "<" is a flag llmgw's list has and this image lacks (a failure).
#
# Usage (from the repository root):
#   HF_MODEL_DIR=/models/Qwen2.5-0.5B-Instruct \
#   GGUF_FILE=/models/qwen2.5-0.5b-instruct-q8_0.gguf \
#   GPU=0 deploy/engine-smoke.sh [vllm] [sglang] [llamacpp]
#
# HF_MODEL_DIR is a Hugging Face snapshot (config.json, tokenizer,
# safetensors) for vLLM and SGLang; GGUF_FILE a GGUF file for llama.cpp.
# Nothing is downloaded by the engines (HF_HUB_OFFLINE=1).
set -euo pipefail

GPU=${GPU:-0}
PORT=${PORT:-18000}
KEY=${KEY:-smoke-key}
NAME=smoke
TIMEOUT_S=${TIMEOUT_S:-900}
root=$(cd "$(dirname "$0")/.." && pwd)
pinned=$root/supervisor/profile/pinned.go
flags=$root/supervisor/profile/testdata/flags

# image prints the pinned image constant NAME of pinned.go.
image() { sed -n "s/^[[:space:]]*$1 = \"\(.*\)\"$/\1/p" "$pinned"; }

fail=0
container=""
cleanup() { [ -n "$container" ] && docker rm -f "$container" >/dev/null 2>&1 || true; }
trap cleanup EXIT

# wait_ready polls /health until it answers 200 or TIMEOUT_S passes.
wait_ready() {
	local deadline=$((SECONDS + TIMEOUT_S))
	until curl -fsS -o /dev/null "http://127.0.0.1:$PORT/health"; do
		if ! docker inspect -f '{{.State.Running}}' "$container" 2>/dev/null | grep -q true; then
			echo "engine exited before it was ready:"; docker logs --tail 50 "$container"; return 1
		fi
		if [ $SECONDS -ge $deadline ]; then
			echo "not ready within ${TIMEOUT_S}s:"; docker logs --tail 50 "$container"; return 1
		fi
		sleep 5
	done
}

# check runs the three probes llmgw depends on.
check() {
	local engine=$1
	wait_ready || return 1
	curl -fsS -H "Authorization: Bearer $KEY" "http://127.0.0.1:$PORT/v1/models" | grep -q "\"$NAME\"" ||
		{ echo "$engine: /v1/models does not list $NAME"; return 1; }
	curl -fsS -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
		-d "{\"model\":\"$NAME\",\"prompt\":\"The capital of France is\",\"max_tokens\":8}" \
		"http://127.0.0.1:$PORT/v1/completions" | grep -q '"text"' ||
		{ echo "$engine: no completion"; return 1; }
	echo "$engine: /health, /v1/models and a completion OK"
}

# flagdiff compares the image's --help with the accepted list.
flagdiff() {
	local engine=$1; shift
	local got; got=$(mktemp)
	docker run --rm --entrypoint "$1" "${@:2}" 2>/dev/null |
		grep -oE -- '(^|[[:space:],\[])--?[a-z][a-z0-9-]*' | tr -d ' ,[' | sort -u >"$got" || true
	if grep -v '^#' "$flags/$engine.txt" | comm -23 - "$got" | grep .; then
		echo "$engine: the flags above are in testdata/flags/$engine.txt but not in the image's --help"; rm -f "$got"; return 1
	fi
	echo "$engine: every accepted flag is in the image's --help"; rm -f "$got"
}

run_vllm() {
	local img; img=$(image PinnedVLLMImage)
	flagdiff vllm vllm "$img" serve --help=all || fail=1
	container=llmgw-smoke-vllm
	docker run -d --name "$container" --gpus "device=$GPU" --network host --shm-size 8g \
		-e HF_HUB_OFFLINE=1 -e VLLM_API_KEY="$KEY" -v "$HF_MODEL_DIR:/model:ro" \
		--entrypoint vllm "$img" serve /model --served-model-name "$NAME" --host 127.0.0.1 --port "$PORT" \
		--gpu-memory-utilization=0.30 --max-model-len=2048 --max-num-seqs=4 >/dev/null
	check vllm || fail=1
	cleanup; container=""
}

run_sglang() {
	local img cfg
	img=$(image PinnedSGLangImage)
	cfg=$(mktemp -d)
	printf "api-key: '%s'\n" "$KEY" >"$cfg/sglang.yaml"; chmod 600 "$cfg/sglang.yaml"
	flagdiff sglang python3 "$img" -m sglang.launch_server --help || fail=1
	container=llmgw-smoke-sglang
	docker run -d --name "$container" --gpus "device=$GPU" --network host --shm-size 8g \
		-e HF_HUB_OFFLINE=1 -e SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0 \
		-v "$HF_MODEL_DIR:/model:ro" -v "$cfg:/cfg:ro" \
		--entrypoint python3 "$img" -m sglang.launch_server --model-path /model --served-model-name "$NAME" \
		--host 127.0.0.1 --port "$PORT" --enable-metrics --mem-fraction-static=0.30 --context-length=2048 \
		--config /cfg/sglang.yaml >/dev/null
	check sglang || fail=1
	cleanup; container=""; rm -rf "$cfg"
}

run_llamacpp() {
	local img; img=$(image PinnedLlamaCppImage)
	flagdiff llamacpp /app/llama-server "$img" --help || fail=1
	container=llmgw-smoke-llamacpp
	docker run -d --name "$container" --gpus "device=$GPU" --network host \
		-e LLAMA_API_KEY="$KEY" -v "$(dirname "$GGUF_FILE"):/model:ro" \
		--entrypoint /app/llama-server "$img" --model "/model/$(basename "$GGUF_FILE")" --alias "$NAME" \
		--host 127.0.0.1 --port "$PORT" -np 2 -c 4096 --no-kv-unified --fit off --n-gpu-layers 999 --metrics >/dev/null
	check llamacpp || fail=1
	cleanup; container=""
}

engines=("$@")
[ ${#engines[@]} -gt 0 ] || engines=(vllm sglang llamacpp)
for e in "${engines[@]}"; do
	case $e in
	vllm | sglang) : "${HF_MODEL_DIR:?set HF_MODEL_DIR to a Hugging Face snapshot of a tiny model}" ;;
	llamacpp) : "${GGUF_FILE:?set GGUF_FILE to a tiny GGUF model}" ;;
	*) echo "unknown engine $e (vllm, sglang, llamacpp)"; exit 2 ;;
	esac
	"run_$e"
done
[ $fail -eq 0 ] && echo "smoke: all passed" || { echo "smoke: FAILED"; exit 1; }
