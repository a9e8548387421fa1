#!/usr/bin/env bash
# One configuration of the H200 SLO search per device call, executed on the GPU machine from the repository
# root after `go.sh install` (../shared/gpu/go.sh; carried as .gpu/s). `tailgate slo` restarts vLLM 0.24.0 itself
# through `go.sh serve NAME FLAGS` (--server command), so the flags it records are the flags the server ran with;
# the results folder lives in /tmp/w (it survives between warm calls) and is packed into $OUT after each call.
#
#   bash benchmarks/h200/slo.sh CONFIG [N] [TIME_BUDGET_S]
#     chunked    engine default: chunked prefill on, --max-num-batched-tokens 8192 (the H200 default)
#     mnbt2048   chunked prefill on, --max-num-batched-tokens 2048
#     mnbt512    chunked prefill on, --max-num-batched-tokens 512
#     nochunk    --no-enable-chunked-prefill (the budget becomes the context length)
#     lptt1024   chunked prefill on, --long-prefill-token-threshold 1024 (a fifth start, if the budget allows)
#   N: measured requests per probe at least (default 500: a first anytime-valid 95% bound on a p99 needs 449
#   after the start-up cut; 25 warm-up on top); each probe lasts DURATION s of arrivals (default 90) with N the
#   minimum. Before the first probe, STAGE_WARMUP (default 100) requests per round at the top rate (40 req/s)
#   until the worst gap stops falling (at most three rounds, ~1 minute on top of the server's start).
#   TIME_BUDGET_S: seconds of probing (default 420): no probe starts that would overrun it, and the bracket
#   reached so far is the answer.
#   SERVE=0 runs against a server already started in this call (`go.sh serve NAME FLAGS` by hand): the
#   configuration's flags are then recorded as declared, not applied.
#
# The search: the seed's trace (seed 7), SLO TTFT p99 <= 300 ms and worst-gap p99 <= 200 ms (TTFT from the intended
# send), doubling from START (default 5) req/s, narrowing to RESOLUTION (default 15%); an undecided rate is
# probed again with a new sample of the workload when only its data can narrow the bracket (anytime-valid
# verdicts, pooled); halving no lower than 2.5 req/s. A probe lasts DURATION s of arrivals (default 90) plus
# ~15 s; TIME_BUDGET_S bounds the probing, and the server's start (~80-100 s) comes on top: keep the two under
# the 10-minute command limit.
#
# At the end of the search `tailgate slo` fits the server's step loop to the probes' streams and simulates it
# (8 x 40,000 requests, the replicates in processes of their own: 34 s on a 16-core H100 host, 137 s in one
# process): a labelled model interval that narrows the bracket when its replay of every probe agrees (README, "The
# server's own step loop"); keep ~1 minute of the call for it (the readings of the square past the largest step
# measured are simulated too, at 8 x 10,000). From the
# fifth probe on, once a rate has failed, the same fit runs after each attempt, and the search ends as soon as its
# checked bracket meets RESOLUTION (status settled): keep ~60 s per such probe too.
# A call that resumes a configuration whose server is still up from the call before (a warm machine) may skip the
# restart: SERVE=0 (saves the ~75-100 s start; the flags are then recorded as declared).
#
# Device calls (../shared/gpu/README.md: `prepare.sh .gpu` here first, with the suite's wheels as for device.sh).
# The tree plus one carried chunk must stay under 64 MiB: with the tree's ~25 MB of results, split the bundle in
# 36 MB chunks (cat .gpu/p*/chunk.* | split -b 36000000 -d - chunk.; one per .gpu/pK). gevent needs zope.event
# and zope.interface, both in the `zope` namespace: unzip their wheels into /tmp/site (pip --target replaces the
# whole `zope` folder with each one).
#   carry [.gpu/p1, .gpu/s]:    bash .gpu/s/go.sh env; bash .gpu/s/go.sh stage 1      (then stage K for each chunk)
#   carry [.gpu/s, .gpu/model, .wheels312]:
#                               bash .gpu/s/go.sh install && bash benchmarks/h200/loadpath.sh && bash benchmarks/h200/slo.sh chunked 200
#   carry [.gpu/s]:             bash benchmarks/h200/slo.sh mnbt2048 200
#   carry [.gpu/s]:             bash benchmarks/h200/slo.sh mnbt512 200
#   carry [.gpu/s]:             bash benchmarks/h200/slo.sh nochunk 200; bash .gpu/s/go.sh stop
# Each call's tar holds every configuration run so far; here, unpack the last one and build the report:
#   tar xzf results-slo-nochunk.tar.gz -C results/h200 && tailgate report results/h200/slo
set -uo pipefail
config=${1:?usage: slo.sh CONFIG [N] [TIME_BUDGET_S]}; n=${2:-500}; budget=${3:-420}
source "$(dirname "$0")/layout.sh"
OUT=${OUT:-/tmp/out}; R=${RESULTS:-/tmp/w/results/slo}; mkdir -p "$R" "$OUT"
HOST=${HOST:-http://127.0.0.1:8000}
GO=${GO:-.gpu/s/go.sh}
SLO=${SLO:-ttft_p99<=300ms,gap_p99<=200ms}
case "$config" in
  chunked)  knobs="chunked=on" ;;
  mnbt2048) knobs="chunked=on max-num-batched-tokens=2048" ;;
  mnbt512)  knobs="chunked=on max-num-batched-tokens=512" ;;
  nochunk)  knobs="chunked=off" ;;
  lptt1024) knobs="chunked=on long-prefill-token-threshold=1024" ;;
  *) echo "unknown configuration $config (chunked, mnbt2048, mnbt512, nochunk, lptt1024)"; exit 2 ;;
esac
if [ "${SERVE:-1}" = 1 ]; then
  server=(--server command --restart-command "bash $GO serve {config} {flags}")
else
  server=(--server url)
fi
python3 -c "import locust, gevent" 2>/dev/null || {
  echo "slo.sh: the load path is not installed here (no locust): run benchmarks/h200/loadpath.sh first"; exit 2; }
t0=$(date +%s)
python3 -m tailgate.cli slo "${server[@]}" --host "$HOST" --results "$R" --config "$config: $knobs" \
  --slo "$SLO" --n "$n" --duration "${DURATION:-90}" --warmup 25 --seed 7 --ignore-eos \
  --start-rate "${START:-5}" --max-rate 40 --min-rate 2.5 --resolution "${RESOLUTION:-15%}" --max-probes 12 \
  --reruns 0 --extend 0 --stage-warmup "${STAGE_WARMUP:-100}" --time-budget "$budget" --no-report 2>&1 \
  | grep -vE "in flight, about|^\s*$"
rc=${PIPESTATUS[0]}
echo "slo $config exit $rc after $(( $(date +%s) - t0 )) s"
bash "$GO" log >/dev/null 2>&1   # the server logs (scheduler stats every 5 s) travel with the results
mkdir -p "$R/server-logs" && cp "$OUT"/server_*.log "$R/server-logs/" 2>/dev/null; rm -f "$OUT"/server_*.log
tar czf "$OUT/results-slo-$config.tar.gz" -C "$(dirname "$R")" "$(basename "$R")"
ls -la "$OUT"
exit "$rc"
