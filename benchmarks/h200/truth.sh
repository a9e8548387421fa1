#!/usr/bin/env bash
# Long-run truth on the H200 for issue #40's coverage: one probe of N measured requests (default 4,000) at each
# RATE, workload seed 11 (the searches use 7), the same SLO and trace as benchmarks/h200/slo.sh, read afterwards
# with fixed-n bounds and a time-block bootstrap by benchmarks/slo_truth_real.py. Executed on the GPU machine from
# the repository root after `go.sh install` and the load path (benchmarks/h200/loadpath.sh).
#
#   bash benchmarks/h200/truth.sh CONFIG RATES [N]
#     CONFIG: chunked (engine default) or nochunk (--no-enable-chunked-prefill); RATES: comma-separated req/s
#   SERVE=1 (default) starts the configuration's server first (go.sh serve, ~95-115 s); SERVE=0 uses the one up.
#   STAGE_WARMUP=K sends K unmeasured requests first (default 100 with SERVE=1, none with SERVE=0).
#   PART=K measures one more part of each rate (folder rRATE-partK, workload seed 11+K): where N requests at RATE
#   take longer than one call (4,000 at 7 req/s: 571 s of arrivals), N/2 in each of two calls, read as one truth.
#   One call may run 10 minutes: 4,000 requests take 4000/RATE s of arrivals, plus ~20 s of stage warm-up when
#   SERVE=1 (one round of 100 requests). Results stay in /tmp/w/truth (warm calls share it); each call packs the
#   whole folder into $OUT/truth.tar.gz. Here:
#     tar xzf truth.tar.gz -C /tmp && python benchmarks/slo_truth_real.py read /tmp/truth --json truth.json
set -uo pipefail
config=${1:?usage: truth.sh CONFIG RATES [N]}; rates=${2:?rates}; n=${3:-4000}
source "$(dirname "$0")/layout.sh"
OUT=${OUT:-/tmp/out}; R=${RESULTS:-/tmp/w/truth}; mkdir -p "$R" "$OUT"
HOST=${HOST:-http://127.0.0.1:8000}; GO=${GO:-.gpu/s/go.sh}
SLO=${SLO:-ttft_p99<=300ms,gap_p99<=200ms}
case "$config" in
  chunked) flags=(); knobs="chunked=on" ;;
  nochunk) flags=(--no-enable-chunked-prefill); knobs="chunked=off" ;;
  *) echo "unknown configuration $config (chunked, nochunk)"; exit 2 ;;
esac
python3 -c "import locust, gevent" 2>/dev/null || { echo "truth.sh: run benchmarks/h200/loadpath.sh first"; exit 2; }
warm=${STAGE_WARMUP:-0}
if [ "${SERVE:-1}" = 1 ]; then
  bash "$GO" serve "$config" ${flags[@]+"${flags[@]}"} | tail -3 || exit 1
  warm=${STAGE_WARMUP:-100}
fi
t0=$(date +%s)
python3 benchmarks/slo_truth_real.py run --host "$HOST" --config "$config: $knobs" --slo "$SLO" --rates "$rates" \
  --n "$n" --ignore-eos --stage-warmup "$warm" --part "${PART:-0}" --out "$R/$config" 2>&1 \
  | grep -vE "in flight, about|^\s*$"
rc=${PIPESTATUS[0]}
echo "truth $config $rates exit $rc after $(( $(date +%s) - t0 )) s"
bash "$GO" log >/dev/null 2>&1
mkdir -p "$R/server-logs" && cp "$OUT"/server_*.log "$R/server-logs/" 2>/dev/null; rm -f "$OUT"/server_*.log
bash "$GO" metrics > "$R/$config/metrics-after-$(date +%s).txt" 2>/dev/null
tar czf "$OUT/truth.tar.gz" -C "$(dirname "$R")" "$(basename "$R")"
ls -la "$OUT"
exit "$rc"
