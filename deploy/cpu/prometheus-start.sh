#!/bin/sh
# Writes the scrape configuration for $SCRAPE_TARGET, then runs Prometheus on $LISTEN_ADDRESS.
# The target comes from the environment because with host networking the server's port is the one the
# compose file chose (VLLM_PORT), not a fixed alias. Scraped every second: a 30 s load stage needs finer
# brackets than the usual 5-15 s. Storage lives in the container: `docker compose down` removes it.
set -eu
: "${SCRAPE_TARGET:=127.0.0.1:8000}"
: "${LISTEN_ADDRESS:=127.0.0.1:9090}"
mkdir -p /tmp/prometheus
cat > /tmp/prometheus/prometheus.yml <<CONFIG
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: vllm
    metrics_path: /metrics
    static_configs:
      - targets: ["${SCRAPE_TARGET}"]
CONFIG
exec /usr/bin/prometheus --config.file=/tmp/prometheus/prometheus.yml --storage.tsdb.path=/tmp/prometheus/data \
  --web.listen-address="${LISTEN_ADDRESS}" --web.enable-lifecycle "$@"
