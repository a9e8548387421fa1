#!/usr/bin/env bash
# One step of the H200 run, executed on the GPU machine from the repository root, after
# `go.sh install` and `go.sh serve NAME [FLAGS]` (../shared/gpu/go.sh) have a vLLM 0.24.0 server
# on :8000. Runs the suite's cells for the server configuration that is up, and the reference
# harness on the same cells in the same server session, then packs the results into $OUT.
#
#   bash benchmarks/h200/device.sh STEP N
#     chunked-a   continuous 5, 10, 20 req/s and gated B=16 (server: default flags)
#     chunked-b   continuous 1 req/s (the longest cell)
#     nochunk     continuous 5 and 10 req/s (server: --no-enable-chunked-prefill)
#     preempt     continuous 10 req/s (server: --max-model-len 8192 --num-gpu-blocks-override B)
#   N: measured requests per cell (25 warm-up on top).
# The harness is expected at .gpu/harness/batching_bench.py (extracted from the article, with
# ignore_eos added, by benchmarks/h200/prepare_harness.py); it is never committed.
# The gated cell at n=500 (both tools, one server session, one call): benchmarks/h200/gated.sh.
set -uo pipefail
step=$1; n=${2:-200}
source "$(dirname "$0")/layout.sh"
OUT=${OUT:-/tmp/out}; R=/tmp/w/results; mkdir -p "$R/suite" "$R/harness" "$OUT"
HOST=${HOST:-http://127.0.0.1:8000}
MODEL=${MODEL:-meta-llama/Llama-3.1-8B-Instruct}
suite() {  # CONFIG ARGS...
  local config=$1; shift
  python3 -m tailgate.cli suite --server url --host $HOST --configs "$config" --results "$R/suite" \
    --n "$n" --warmup 25 --ignore-eos --no-report --nochunk-rates none --preempt-rate none "$@" 2>&1 \
    | grep -vE "in flight, about|^\s*$"
}
harness() {  # NAME ARGS...
  local name=$1; shift
  local t0=$(date +%s)
  python3 "${HARNESS:-.gpu/harness/batching_bench.py}" --base-url $HOST/v1 --model "$MODEL" --n "$n" --out "$R/harness/$name.json" "$@" \
    | python3 -c "import json,sys; s=json.load(sys.stdin); print('harness', '$name', json.dumps(s))"
  echo "harness $name took $(( $(date +%s) - t0 )) s"
}
case "$step" in
chunked-a)
  for r in 5 10 20; do suite chunked --rates $r --no-gated; harness cont_r$r --arm continuous --rate $r; done
  suite chunked --rates 5 --batch-size 16 --locust-arg=--settle=1 | grep -v cont_r5
  harness gated_b16 --arm gated --batch-size 16 ;;
chunked-b)
  suite chunked --rates 1 --no-gated; harness cont_r1 --arm continuous --rate 1 ;;
nochunk)
  for r in 5 10; do
    python3 -m tailgate.cli suite --server url --host $HOST --configs nochunk --results "$R/suite" --n "$n" \
      --warmup 25 --ignore-eos --no-report --rates 1 --no-gated --nochunk-rates $r --preempt-rate none 2>&1 \
      | grep -vE "in flight, about|^\s*$"
    harness nochunk_r$r --arm continuous --rate $r
  done ;;
preempt)
  python3 -m tailgate.cli suite --server url --host $HOST --configs preempt --results "$R/suite" --n "$n" \
    --warmup 25 --ignore-eos --no-report --rates 1 --no-gated --nochunk-rates none --preempt-rate 10 2>&1 \
    | grep -vE "in flight, about|^\s*$"
  harness preempt_r10 --arm continuous --rate 10 ;;
*) echo "unknown step $step"; exit 2 ;;
esac
tar czf "$OUT/results-$step.tar.gz" -C /tmp/w results
ls -la "$OUT"
