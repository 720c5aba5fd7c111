#!/bin/bash
# Idle CPU per agent, the setup of issue 26: N separate `llmgw node up` processes on
# loopback (--runtime none, 8 simulated H100s, the lan profile), ceil(N/4) deployments of 8
# replicas at TP 2, then the median per-agent CPU share over a window once placed and idle.
# usage: scenarios/idle-cpu.sh N [window_s]   (PROFILE=1 also saves a CPU profile, over the window, of one
# agent, served by its --debug-addr, to /tmp/idle/cpu-N.pprof). Not part of make test: minutes, and
# it wants an otherwise idle machine. Binary: bin/llmgw (make build).
N=$1; WIN=${2:-20}; BIN=${LLMGW_BIN:-$(cd "$(dirname "$0")/.." && pwd)/bin/llmgw}; D=/tmp/idle/c$N; mkdir -p /tmp/idle
pkill -f "llmgw node up --name idle-"; for t in $(seq 1 30); do pgrep -f "llmgw node up --name idle-" >/dev/null || break; sleep 1; done
rm -rf $D; mkdir -p $D
head -c 32 /dev/urandom | base64 > $D/gossip.key
head -c 24 /dev/urandom | base64 > $D/token
BASE=30000
for i in $(seq 0 $((N-1))); do
  g=$((BASE+i)); a=$((BASE+1000+i))
  join=""; [ $i -gt 0 ] && join="--join 127.0.0.1:$BASE"
  dbg=""; [ $i -eq 5 ] && dbg="--debug-addr 127.0.0.1:6060"
  $BIN node up --name idle-$i --data-dir $D/n$i --bind 127.0.0.1:$g --api 127.0.0.1:$a --gateway "" \
    --gossip-key-file $D/gossip.key --token-file $D/token --profile lan --runtime none --simulate-gpus 8xH100-80GB $join \
    --log-level warn $dbg > $D/n$i.log 2>&1 &
done
API=http://127.0.0.1:$((BASE+1000))
for t in $(seq 1 120); do
  m=$(curl -s $API/v1/cluster | python3 -c "import json,sys; d=json.load(sys.stdin); print(sum(1 for m in d['members'] if m['state']=='alive'))" 2>/dev/null)
  [ "$m" = "$N" ] && break; sleep 1
done
echo "members alive: $m after ${t}s"
DEPS=$(( (N+3)/4 ))
for k in $(seq 1 $DEPS); do
  $BIN place dep$k --model m/tiny --engine fake --replicas 8 --tp 2 --addr $API --token-file $D/token >/dev/null || echo "place dep$k failed"
done
for t in $(seq 1 180); do
  r=$(curl -s $API/v1/shards | python3 -c "import json,sys; d=json.load(sys.stdin); print(sum(1 for s in d if s.get('lease')=='valid'))" 2>/dev/null)
  [ "$r" = "$((DEPS*8))" ] && break; sleep 1
done
echo "valid shards: $r of $((DEPS*8)) after ${t}s"
sleep 15
PIDS=$(pgrep -f "llmgw node up --name idle-")
declare -A before
for p in $PIDS; do before[$p]=$(awk '{print $14+$15}' /proc/$p/stat); done
[ -n "$PROFILE" ] && curl -s -o /tmp/idle/cpu-$N.pprof "http://127.0.0.1:6060/debug/pprof/profile?seconds=$WIN" &
sleep $WIN
python3 - "$WIN" $(for p in $PIDS; do echo "$p:${before[$p]}:$(awk '{print $14+$15}' /proc/$p/stat)"; done) <<'PY'
import sys, os, statistics
win=float(sys.argv[1]); hz=os.sysconf('SC_CLK_TCK')
shares=[ (int(c)-int(b))/hz/win*100 for p,b,c in (a.split(':') for a in sys.argv[2:]) ]
print(f"nodes {len(shares)}: idle CPU per node median {statistics.median(shares):.2f}% of a core, mean {statistics.mean(shares):.2f}%, max {max(shares):.2f}%")
PY
