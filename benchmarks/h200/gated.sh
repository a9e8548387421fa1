#!/usr/bin/env bash
# The gated cell (B=16, n=500 measured + 25 warm-up, seed 7) measured by this suite and by the reference
# harness against ONE vLLM 0.24.0 server session, in ONE device call, with every result under $OUT.
#
# Before the call, on this machine:
#   bash ../shared/gpu/prepare.sh .gpu ...        # as for device.sh (vLLM + the suite's wheels, model)
#   python benchmarks/h200/prepare_harness.py     # .gpu/harness/batching_bench.py, ignore_eos added
# Earlier device calls stage the chunks and install (see ../shared/gpu/README.md). The call itself,
# carrying [.gpu/s, .gpu/model, .gpu/harness], about 6 minutes (server start ~100 s, each tool ~110 s):
#   bash .gpu/s/go.sh serve chunked --enable-log-requests --max-log-len 16 && bash benchmarks/h200/gated.sh
# --enable-log-requests makes vLLM log "Received request cmpl-<X-Request-Id>-0" as its API server takes each
# request in: the server's own arrival order, which benchmarks/arrival_order.py checks against trace order.
# Without it the run is the same and the order check says the log has no such lines.
#
# $OUT receives: results-gated.tar.gz (records, summaries, run.json, harness output), comparison.md,
# arrival-order.json / .txt, and the server log.
set -uo pipefail
n=${N:-500}; seed=${SEED:-7}; batch=${BATCH:-16}; warmup=${WARMUP:-25}
source "$(dirname "$0")/layout.sh"
OUT=${OUT:-/tmp/out}; W=${WORK:-/tmp/w}; R=$W/results-gated; mkdir -p "$R/suite" "$R/harness" "$OUT"
HOST=${HOST:-http://127.0.0.1:8000}
MODEL=${MODEL:-meta-llama/Llama-3.1-8B-Instruct}
HARNESS=${HARNESS:-.gpu/harness/batching_bench.py}
LIMIT_S=${LIMIT_S:-200}   # per tool: the call must end inside the device's 10-minute limit
cell="$R/suite/chunked_gated_b${batch}"
rm -rf "$cell"
t0=$(date +%s)

echo "== suite: gated B=$batch n=$n seed $seed"
timeout "$LIMIT_S" python3 -m locust -f locustfiles/gated.py --headless --only-summary --host "$HOST" \
  --results-dir "$cell" --config-label chunked --n "$n" --warmup "$warmup" --seed "$seed" \
  --batch-size "$batch" --ignore-eos --loglevel INFO 2>&1 | grep -E "tailgate: (gated|load process|.*TTFT)" | tail -5
echo "suite took $(( $(date +%s) - t0 )) s"

echo "== reference harness: gated B=$batch n=$n seed $seed (same server session)"
t1=$(date +%s)
timeout "$LIMIT_S" python3 "$HARNESS" --base-url "$HOST/v1" --model "$MODEL" --arm gated --batch-size "$batch" \
  --n "$n" --warmup "$warmup" --seed "$seed" --out "$R/harness/gated_b${batch}.json" > "$R/harness/stdout.txt" 2>&1
python3 -c "import json,sys; print('harness', json.dumps(json.load(open(sys.argv[1]))['summary']))" \
  "$R/harness/gated_b${batch}.json" 2>/dev/null || tail -5 "$R/harness/stdout.txt"
echo "harness took $(( $(date +%s) - t1 )) s"

echo "== comparison and arrival order"
python3 benchmarks/h200/compare.py "$R" > "$OUT/comparison.md" 2>&1; cat "$OUT/comparison.md"
log=${SERVER_LOG:-$(ls -t "$W"/server_*.log 2>/dev/null | head -1)}
if [ -n "$log" ]; then
  python3 benchmarks/arrival_order.py "$log" "$cell" --json "$OUT/arrival-order.json" | tee "$OUT/arrival-order.txt"
  gzip -c "$log" > "$OUT/$(basename "$log").gz"
fi
python3 - "$cell" <<'PY' | tee "$OUT/client-quality.txt"
import glob, json, sys
s = json.load(open(glob.glob(sys.argv[1] + "/summary-*.json")[0]))
keys = ("n", "errors", "schedule_lag_p99", "client_coalesced_streams", "max_read_delay_p99", "max_events_per_read_max")
print("suite client figures:", {k: s.get(k) for k in keys})
PY
tar czf "$OUT/results-gated.tar.gz" -C "$W" results-gated
echo "gated.sh took $(( $(date +%s) - t0 )) s"; ls -la "$OUT"
