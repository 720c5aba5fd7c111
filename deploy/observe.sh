#!/usr/bin/env bash
# make observe: a Prometheus from the system's package scraping the demo
# cluster (make run) through its discovery endpoint, so the Grafana
# dashboard in deploy/grafana has data. usage: deploy/observe.sh DEMO_DIR
# [start|stop]. Prometheus listens on 127.0.0.1:${PROM_PORT:-9090}, keeps its
# data under DEMO_DIR/prometheus and stops with make stop.
set -euo pipefail
dir=${1:?usage: observe.sh DEMO_DIR [start|stop]}/prometheus
action=${2:-start}
port=${PROM_PORT:-9090}
api=${LLMGW_ADDR:-http://127.0.0.1:7070}
if [ "$action" = stop ]; then
  [ -f "$dir/pid" ] && kill "$(cat "$dir/pid")" 2>/dev/null && echo "prometheus stopped" || true
  rm -f "$dir/pid"
  exit 0
fi
command -v prometheus >/dev/null || { echo "make observe: no prometheus on PATH; install it (Debian, Ubuntu: apt-get install prometheus), then run make observe again" >&2; exit 1; }
curl -fsS "$api/v1/prometheus/targets" >/dev/null || { echo "make observe: no llmgw node answers at $api; start the demo first (make run)" >&2; exit 1; }
if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
  echo "prometheus already runs (pid $(cat "$dir/pid")) at http://127.0.0.1:$port"
  exit 0
fi
mkdir -p "$dir/data"
cat > "$dir/prometheus.yml" <<CONF
global:
  scrape_interval: 5s
scrape_configs:
  - job_name: llmgw
    http_sd_configs:
      - url: $api/v1/prometheus/targets
        refresh_interval: 10s
CONF
nohup prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
  --web.listen-address="127.0.0.1:$port" --log.level=warn > "$dir/prometheus.log" 2>&1 &
echo $! > "$dir/pid"
for _ in $(seq 1 50); do
  curl -fsS "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$port/-/ready" >/dev/null || { echo "make observe: prometheus did not start; see $dir/prometheus.log" >&2; exit 1; }
cat <<MSG
prometheus at http://127.0.0.1:$port, scraping every node and engine found at $api/v1/prometheus/targets
  (log $dir/prometheus.log; make stop stops it with the demo).
grafana: add a Prometheus data source with URL http://127.0.0.1:$port, then import deploy/grafana/llmgw.json.
MSG
