#!/usr/bin/env bash
# CPU per chunk of one load process (issue #43's target: <= 15 us with kernel stamps), this tree against
# another (OLD), alternated round by round so both see the same host: the self-check at RATE req/s of
# 100-chunk streams, N requests, one load process, one reference worker. Needs only the load path's wheels.
#
#   carry [.wheels312, OLD]:  bash benchmarks/h200/loadpath.sh && OLD=.gpu/oldtree bash benchmarks/device/one_process.sh
#   carry [.wheels312]:       bash benchmarks/h200/loadpath.sh && bash benchmarks/device/one_process.sh   (this tree alone)
#   ROUNDS (3), RATE (200), N (6000); logs and JSON land in $OUT. Here: python benchmarks/one_process.py $OUT
# Without OLD each round runs this tree only: the reference server's own CPU per chunk in the same run is then
# the yardstick of the host's speed.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
NEW=$PWD; trees="new"
if [ -n "${OLD:-}" ]; then OLD=$(cd "$OLD" && pwd) && trees="old new"; fi
ROUNDS=${ROUNDS:-3}; RATE=${RATE:-200}; N=${N:-6000}
echo "cores $(nproc); $(uptime)"
lscpu | grep -E "^Model name" || true
for round in $(seq "$ROUNDS"); do
  for tree in $trees; do
    dir=${OLD:-}; [ "$tree" = new ] && dir=$NEW
    log=$OUT/selfcheck-$tree-$round.log
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 300 python3 -m tailgate.cli selfcheck --rate "$RATE" --n "$N" \
      --processes 1 --truth-workers 1 --chunk-stamp kernel --json "$OUT/selfcheck-$tree-$round.json" >"$log" 2>&1)
    echo "round $round $tree: exit $? | $(grep -E '^load generator CPU' "$log") | $(grep '^verdict' "$log")"
  done
done
echo "$(uptime)"
