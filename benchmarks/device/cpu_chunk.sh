#!/usr/bin/env bash
# CPU per chunk on the 16-core host, this tree against another (OLD), interleaved: the read path alone
# (benchmarks/read_path.py), then the whole load process through the self-check (benchmarks/stamp_matrix.py,
# one repeat per tree per round). Needs only the load path's wheels (benchmarks/h200/loadpath.sh), no vLLM.
#
#   carry [.wheels312, OLD]:  bash benchmarks/h200/loadpath.sh && OLD=.gpu/oldtree bash benchmarks/device/cpu_chunk.sh
#   ROUNDS (3), RATE (200), STAGE_S (30), STAMPS (kernel); everything lands in $OUT.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
OLD=$(cd "${OLD:?set OLD to the other tree}" && pwd); NEW=$PWD
ROUNDS=${ROUNDS:-3}; RATE=${RATE:-200}; STAGE_S=${STAGE_S:-30}; STAMPS=${STAMPS:-kernel}
echo "cores $(nproc); $(uptime)"
for round in $(seq "$ROUNDS"); do
  for tree in old new; do
    dir=$OLD; [ "$tree" = new ] && dir=$NEW
    echo -n "round $round $tree: "
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir python3 benchmarks/read_path.py --rate "$RATE" --n 1000 --repeat 1 | tail -1)
  done
done
for round in $(seq "$ROUNDS"); do
  for tree in old new; do
    dir=$OLD; [ "$tree" = new ] && dir=$NEW
    echo "=== round $round $tree: self-check, $RATE req/s, $STAGE_S-s stage"
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir python3 benchmarks/stamp_matrix.py --rates "$RATE" --stamps "$STAMPS" \
      --stage-seconds "$STAGE_S" --repeat 1 --json "$OUT/matrix-$tree-$round.json" 2>&1 | grep -v "^\[selfcheck\]" | tail -6)
  done
done
echo "$(uptime)"
