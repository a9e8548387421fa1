#!/usr/bin/env bash
# guard.sh DEADLINE_S HARD_S CONFIG N BUDGET: benchmarks/h200/slo.sh with a soft stop. A probe that starts too late
# to end DEADLINE_S seconds after this script began is stopped at once, and anything still running at HARD_S is
# stopped too (SIGTERM to the slo process alone: it stops its Locust child, keeps finished probes, and slo.sh packs
# the results into $OUT); the next call resumes the same search.
deadline=$1; hard=$2; shift 2
t0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/w
log="$OUT/console.log"
: > "$log"; stdbuf -oL -eL bash benchmarks/h200/slo.sh "$@" >> "$log" 2>&1 &
spid=$!
seen=0; stopped=0
stop() {
  pid=$(pgrep -f -- "-m tailgate.cli slo" | head -1)
  echo "guard: $1: stopping the search (pid ${pid:-none})" >> "$log"
  [ -n "$pid" ] && kill -TERM "$pid"; stopped=1
}
while kill -0 $spid 2>/dev/null; do
  sleep 1
  el=$(( $(date +%s) - t0 ))
  n=$(grep -c ' s of arrivals)' "$log")
  if [ "$n" -gt "$seen" ]; then
    seen=$n
    est=$(grep -o '(~[0-9]* s of arrivals)' "$log" | tail -1 | tr -dc 0-9)
    [ $stopped = 0 ] && [ $((el + est + 20)) -gt "$deadline" ] && stop "at ${el} s a probe of ~${est} s would end past ${deadline} s"
  fi
  [ $stopped = 0 ] && [ "$el" -gt "$hard" ] && stop "${el} s: past ${hard} s"
done
wait $spid; rc=$?
echo "guard: slo.sh exit $rc after $(( $(date +%s) - t0 )) s" >> "$log"
n=$(ls /tmp/w/console-*.log 2>/dev/null | wc -l); cp "$log" "/tmp/w/console-$((n+1)).log"
cat "$log"
exit $rc
