#!/usr/bin/env bash
# Issue-21 targets on a many-core host: one process at 50-250 req/s and four processes at 400-800 req/s,
# three repeats per cell (benchmarks/scale.py over tailgate selfcheck), then the read path's CPU per
# chunk against the tree before the change (BEFORE), then the dispatcher's spin at a shorter length.
# Run from a checkout's root with locust/gevent importable; everything lands in $OUT/results.tgz.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
PY=${PY:-python3}
RES=$(mktemp -d)
P1=${P1:-50,100,150,200,250}; P4=${P4:-400,600,800}; DUR=${DUR:-3}; REP=${REP:-3}
echo "cores $(nproc); $(uptime)"
"$PY" benchmarks/scale.py --rates "$P1" --repeat "$REP" --duration-s "$DUR" \
  --report "$RES/scale-p1.md" --json "$RES/scale-p1.json" 2>&1 | grep -v "^\[selfcheck\]"
tar -czf "$OUT/results.tgz" -C "$RES" .  # again after each part: a run cut short still returns what it did
"$PY" benchmarks/scale.py --rates "$P4" --processes 4 --repeat "$REP" --duration-s "$DUR" \
  --report "$RES/scale-p4.md" --json "$RES/scale-p4.json" 2>&1 | grep -v "^\[selfcheck\]"
tar -czf "$OUT/results.tgz" -C "$RES" .
echo "=== read path, this tree"; "$PY" benchmarks/read_path.py --rate 200 --n ${RP_N:-600} --repeat 3
if [ -n "${BEFORE:-}" ]; then
  echo "=== read path, tree before"
  PYTHONPATH="$BEFORE:${PYTHONPATH:-}" "$PY" benchmarks/read_path.py --rate 200 --n ${RP_N:-600} --repeat 3
fi
for spin in ${SPINS:-500}; do
  echo "=== spin $spin us, 200 req/s"
  TAILGATE_SPIN_US=$spin "$PY" benchmarks/scale.py --rates 200 --repeat 1 --duration-s "$DUR" \
    --report "$RES/scale-spin$spin.md" --json "$RES/scale-spin$spin.json" 2>&1 | grep "^\[scale\] this"
done
tar -czf "$OUT/results.tgz" -C "$RES" .
