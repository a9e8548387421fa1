#!/usr/bin/env bash
# The decision cell (10 req/s, seed 7: one arrival schedule, one length sequence) with vLLM's prefix caching ON,
# measured with the seed's prompts (`ocean ` x n, served mostly from cache) and with unique prompts (distinct from
# their first token, exact lengths for the served tokenizer via /tokenize), for chunked prefill on and off. The
# report pairs each seed cell with its unique twin (the same bootstrap intervals as chunked on vs off) and says
# whether chunked prefill's effect on the worst-gap p99 survives realistic prompts.
# Executed on the GPU machine from the repository root after `go.sh install` (../shared/gpu/go.sh, carried as
# .gpu/s); one configuration per device call, results in /tmp/w (they survive between warm calls), packed into $OUT.
#
#   bash benchmarks/h200/prompts_ab.sh CONFIG [N]
#     chunked   engine default (chunked prefill on), prefix caching on
#     nochunk   --no-enable-chunked-prefill, prefix caching on
#   N: measured requests per cell (default 500; 25 warm-up on top). Each call: server start ~100 s, two cells of
#   525 requests at 10 req/s (~55 s each plus ~10 s of /tokenize for the unique prompts): about 4-5 minutes.
#   SERVE=0 runs against a server already started in this call (`PREFIX_CACHE=on go.sh serve NAME FLAGS`).
#
# Device calls (../shared/gpu/README.md: `prepare.sh .gpu` here first, with the suite's wheels as for device.sh):
#   carry [.gpu/p1, .gpu/s]:    bash .gpu/s/go.sh env; bash .gpu/s/go.sh stage 1      (then stage K for each chunk)
#   carry [.gpu/s, .gpu/model]: bash .gpu/s/go.sh install && bash benchmarks/h200/prompts_ab.sh chunked
#   carry [.gpu/s]:             bash benchmarks/h200/prompts_ab.sh nochunk; bash .gpu/s/go.sh stop
# The second call's tar holds both configurations; here:
#   mkdir -p results/h200 && tar xzf results-prompts-ab-nochunk.tar.gz -C results/h200 \
#     && tailgate report results/h200/prompts-ab
set -uo pipefail
config=${1:?usage: prompts_ab.sh CONFIG [N]}; n=${2:-500}
source "$(dirname "$0")/layout.sh"
OUT=${OUT:-/tmp/out}; R=${RESULTS:-/tmp/w/results/prompts-ab}; mkdir -p "$(dirname "$R")" "$OUT"
HOST=${HOST:-http://127.0.0.1:8000}
GO=${GO:-.gpu/s/go.sh}
case "$config" in
  chunked) flags=(); cells=(--configs chunked --rates 10) ;;
  nochunk) flags=(--no-enable-chunked-prefill); cells=(--configs nochunk --nochunk-rates 10) ;;
  *) echo "unknown configuration $config (chunked, nochunk)"; exit 2 ;;
esac
if [ "${SERVE:-1}" = 1 ]; then
  PREFIX_CACHE=on bash "$GO" serve "$config" "${flags[@]}" || { echo "server $config did not start"; exit 1; }
fi
resume=(); [ -f "$R/suite.json" ] && resume=(--resume)
t0=$(date +%s)
python3 -m tailgate.cli suite --server url --host "$HOST" --results "$R" "${resume[@]}" "${cells[@]}" \
  --no-gated --preempt-rate none --n "$n" --warmup 25 --seed 7 --ignore-eos --prompts seed,unique \
  --no-report 2>&1 | grep -vE "in flight, about|^\s*$"
rc=${PIPESTATUS[0]}
echo "prompts A/B $config exit $rc after $(( $(date +%s) - t0 )) s"
bash "$GO" log >/dev/null 2>&1   # the server logs (scheduler and prefix-cache stats every 5 s) travel with the results
mkdir -p "$R/server-logs" && cp "$OUT"/server_*.log "$R/server-logs/" 2>/dev/null; rm -f "$OUT"/server_*.log
python3 -m tailgate.postprocess "$R" --out "$R/report" 2>&1 | tail -3 || true
tar czf "$OUT/results-prompts-ab-$config.tar.gz" -C "$(dirname "$R")" "$(basename "$R")"
ls -la "$OUT"
exit "$rc"
