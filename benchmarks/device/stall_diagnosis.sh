#!/usr/bin/env bash
# The ~0.9 s stall on a many-core host: the self-check with the stall watch on, CPython's default collector
# (TAILGATE_STAGE_GC=off) against the stage collector (default), then the tree before this work for the CPU
# per chunk. Run from a checkout's root with locust/gevent importable; $OUT (or ./out) gets the figures.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
PY=${PY:-python3}
N_SCALE=${N_SCALE:-4}
BEFORE=${BEFORE:-}
echo "cores $(nproc); $(uptime)"
sc() { "$PY" -c "from tailgate.cli import main; raise SystemExit(main())" selfcheck "$@"; }
for mode in off on; do
  for rate in ${RATES:-50 200}; do
    rm -f /tmp/stall.*
    echo "=== stage gc $mode, $rate req/s"
    TAILGATE_STAGE_GC=$mode TAILGATE_STALL_LOG=/tmp/stall sc --rate "$rate" --n $((rate * N_SCALE)) \
      --keep "/tmp/sc-$mode-$rate" --json "$OUT/sc-$mode-$rate.json" | grep -E "error|lag|CPU|machine"
    "$PY" benchmarks/stall_trace.py --log '/tmp/stall.*' --records "/tmp/sc-$mode-$rate/results" \
      --json "$OUT/trace-$mode-$rate.json" --max-events 12
  done
done
if [ -n "$BEFORE" ]; then
  for rate in ${RATES:-50 200}; do
    echo "=== tree before, $rate req/s (no watch)"
    (cd "$BEFORE" && sc --rate "$rate" --n $((rate * N_SCALE)) --json "$OUT/before-$rate.json" \
      | grep -E "error|lag|CPU|machine")
  done
fi
