#!/usr/bin/env bash
# containerd.sh: a throwaway containerd daemon for llmgw's integration tests.
#
#   eval "$(.ci/containerd.sh start)"   # installs containerd+runc if missing,
#                                        # starts a private daemon, prints exports
#   go test ./supervisor/runtime/containerd/ ...
#   .ci/containerd.sh stop              # kills its containers and the daemon,
#                                        # unmounts and removes its directory
#
# The daemon gets its own config, root, state and socket under
# /tmp/llmgw-ci-containerd.XXXX, so it never touches a system containerd and
# several can run side by side. The CRI plugin is disabled: the tests need the
# containers, images and tasks services only, and CRI slows the start.
#
# Needs root (containerd and runc do). Only informational lines go to stderr;
# stdout carries nothing but the export lines, so `eval` is safe.
set -euo pipefail

# The last started instance, for `stop` without arguments.
POINTER=/tmp/llmgw-ci-containerd.current
START_TIMEOUT=${LLMGW_CI_CONTAINERD_TIMEOUT:-30}

log() { echo "containerd.sh: $*" >&2; }

install_if_missing() {
	if command -v containerd >/dev/null && command -v runc >/dev/null && command -v ctr >/dev/null; then
		return
	fi
	log "installing containerd and runc"
	if ! command -v apt-get >/dev/null; then
		log "containerd is missing and apt-get is not available; install containerd and runc"
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update >&2
	apt-get install -y containerd runc >&2
}

start() {
	if [[ $(id -u) -ne 0 ]]; then
		log "must run as root"
		exit 1
	fi
	install_if_missing
	local dir sock
	dir=$(mktemp -d /tmp/llmgw-ci-containerd.XXXX)
	sock="$dir/containerd.sock"
	mkdir -p "$dir/root" "$dir/state"
	# Version 2 is the config format containerd 1.6 and 1.7 read (2.x reads
	# it too and migrates in memory).
	cat >"$dir/config.toml" <<EOF
version = 2
root = "$dir/root"
state = "$dir/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = "$sock"

[ttrpc]
  address = "$sock.ttrpc"

[debug]
  address = "$dir/debug.sock"
  level = "info"
EOF
	containerd --config "$dir/config.toml" >"$dir/containerd.log" 2>&1 </dev/null &
	echo $! >"$dir/containerd.pid"
	echo "$dir" >"$POINTER"

	local deadline=$((SECONDS + START_TIMEOUT))
	until ctr --address "$sock" --connect-timeout 1s version >/dev/null 2>&1; do
		if ! kill -0 "$(cat "$dir/containerd.pid")" 2>/dev/null; then
			log "containerd exited during start; its log:"
			tail -n 30 "$dir/containerd.log" >&2
			exit 1
		fi
		if ((SECONDS >= deadline)); then
			log "containerd did not answer on $sock within ${START_TIMEOUT}s; its log:"
			tail -n 30 "$dir/containerd.log" >&2
			stop_dir "$dir"
			exit 1
		fi
		sleep 0.2
	done
	log "containerd $(ctr --address "$sock" version 2>/dev/null | awk '/Server:/{s=1} s&&/Version:/{print $2; exit}') answering on $sock (log $dir/containerd.log)"
	echo "export LLMGW_TEST_CONTAINERD_SOCKET=$sock"
	echo "export LLMGW_CI_CONTAINERD_DIR=$dir"
}

# stop_dir tears down the instance living in $1: every task in every
# namespace (their shims outlive the daemon otherwise), the daemon, leftover
# mounts, the directory.
stop_dir() {
	local dir=$1 sock="$1/containerd.sock"
	case "$dir" in
	/tmp/llmgw-ci-containerd.*) ;;
	*)
		log "refusing to remove $dir: not a directory this script made"
		exit 1
		;;
	esac
	if [[ -S "$sock" ]] && ctr --address "$sock" --connect-timeout 1s version >/dev/null 2>&1; then
		local ns id
		for ns in $(ctr --address "$sock" namespaces list -q 2>/dev/null); do
			for id in $(ctr --address "$sock" -n "$ns" tasks list -q 2>/dev/null); do
				ctr --address "$sock" -n "$ns" tasks kill --all --signal SIGKILL "$id" >/dev/null 2>&1 || true
				ctr --address "$sock" -n "$ns" tasks delete --force "$id" >/dev/null 2>&1 || true
			done
			for id in $(ctr --address "$sock" -n "$ns" containers list -q 2>/dev/null); do
				ctr --address "$sock" -n "$ns" containers delete "$id" >/dev/null 2>&1 || true
			done
		done
	fi
	if [[ -f "$dir/containerd.pid" ]]; then
		local pid i
		pid=$(cat "$dir/containerd.pid")
		if kill -0 "$pid" 2>/dev/null; then
			kill -TERM "$pid" 2>/dev/null || true
			for i in $(seq 1 50); do
				kill -0 "$pid" 2>/dev/null || break
				sleep 0.1
			done
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	# Shims of tasks that could not be deleted still hold their state dir.
	local shim
	for shim in $(pgrep -f "containerd-shim-runc-v2 .*-address $sock" || true); do
		kill -KILL "$shim" 2>/dev/null || true
	done
	# Innermost mounts first.
	local m
	for m in $(awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do
		umount -l "$m" 2>/dev/null || true
	done
	rm -rf "$dir"
	if [[ -f "$POINTER" && "$(cat "$POINTER")" == "$dir" ]]; then
		rm -f "$POINTER"
	fi
	log "stopped and removed $dir"
}

stop() {
	local dir=${1:-${LLMGW_CI_CONTAINERD_DIR:-}}
	if [[ -z "$dir" && -f "$POINTER" ]]; then
		dir=$(cat "$POINTER")
	fi
	if [[ -z "$dir" ]]; then
		log "nothing to stop (no LLMGW_CI_CONTAINERD_DIR and no $POINTER)"
		return 0
	fi
	if [[ ! -d "$dir" ]]; then
		log "$dir is already gone"
		rm -f "$POINTER"
		return 0
	fi
	stop_dir "$dir"
}

case "${1:-}" in
start) start ;;
stop) stop "${2:-}" ;;
*)
	echo "usage: $0 start | stop [DIR]" >&2
	exit 2
	;;
esac
