#!/usr/bin/env bash
# What the dispatcher's send clock costs on the 16-core host: the self-check on one load process, the timerfd
# wake-up (default) against gevent's timer with the 1.5-ms spin (TAILGATE_SEND_TIMERFD=0), interleaved, at
# RATES req/s of 100-chunk streams: CPU per chunk, schedule lag, timing error (benchmarks/stamp_matrix.py).
# Needs only the load path's wheels (benchmarks/h200/loadpath.sh), no vLLM.
#
#   carry [.wheels312]:  bash benchmarks/h200/loadpath.sh && bash benchmarks/device/sendclock.sh
#   ROUNDS (2), RATES (100,200), STAGE_S (20), STAMPS (kernel); everything lands in $OUT/sendclock.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT/sendclock"; OUT=$(cd "$OUT/sendclock" && pwd)
source "$(dirname "$0")/../h200/layout.sh"
ROUNDS=${ROUNDS:-2}; RATES=${RATES:-100,200}; STAGE_S=${STAGE_S:-20}; STAMPS=${STAMPS:-kernel}
echo "cores $(nproc); $(uptime)"
for round in $(seq "$ROUNDS"); do
  for timerfd in 0 1; do
    echo "=== round $round, TAILGATE_SEND_TIMERFD=$timerfd"
    TAILGATE_SEND_TIMERFD=$timerfd python3 benchmarks/stamp_matrix.py --rates "$RATES" --stamps "$STAMPS" \
      --stage-seconds "$STAGE_S" --repeat 1 --processes 1 --json "$OUT/matrix-timerfd$timerfd-$round.json" \
      2>&1 | grep -v "^\[selfcheck\]" | tail -5
  done
done
echo "$(uptime)"
