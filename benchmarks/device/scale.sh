#!/usr/bin/env bash
# The self-check's scale ramp on the 16-core host (issue #43): benchmarks/scale_host.py at RATES req/s of 100-chunk
# streams, STAGE_S seconds of arrivals per step, once per stamp source in STAMPS, `--processes auto` and
# `--truth-workers auto` sized by this host's calibration (printed first), the reference's workers at SCHED_FIFO
# (TRUTH_REALTIME=0: ordinary priority). HOSTS=2 runs the load over two load hosts made of network namespaces.
# Needs only the load path's wheels (benchmarks/h200/loadpath.sh), no vLLM. One call may run 9 minutes: split the
# ramp over calls with RATES, STAMPS and HOSTS; each call's files land in $OUT/$TAG (scale-host.json and .md, every
# step's self-check document under steps/) with the calibration beside them. Merge the calls' tables here with
#   python benchmarks/scale_host.py --merge A/scale-host.json B/scale-host.json ... --out benchmarks/results/DIR
#
#   carry [.wheels312]:  bash benchmarks/h200/loadpath.sh && RATES=250,500,1000,2000 STAMPS=kernel bash benchmarks/device/scale.sh
#   HOSTS=2 needs `ip`: carry [.wheels312, .gpu/iproute] (benchmarks/device/iproute.sh pack .gpu/iproute here), and run
#   `bash benchmarks/device/iproute.sh install .gpu/iproute && export PATH=/tmp/iproute/bin:$PATH` first
#   RATES (250,500,1000,2000,4000), STAMPS (kernel,capture), STAGE_S (30), HOSTS (1), TRUTH_REALTIME (1),
#   STEP_TIMEOUT_S (300; a step past it is stopped, then killed 90 s later), TAG (h<HOSTS>-<STAMPS>-<RATES>),
#   CPU_SPLIT (auto: the reference and the load on CPUs of their own; off: sharing them), PY (python3).
#
# The ramp in calls of at most 9 minutes (each step: 30 s of arrivals, ~10 s of start, then the reference's log
# merged and joined, ~1 s per 250,000 chunks):
#   RATES=250,500,1000,2000 STAMPS=kernel                      about 4-5 min
#   RATES=250,500,1000,2000 STAMPS=capture                     about 4-5 min
#   RATES=1000,2000 STAMPS=kernel HOSTS=2                      about 3 min
#   RATES=4000 STAMPS=kernel,capture STEP_TIMEOUT_S=150        about 5-6 min, at most 8
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../h200/layout.sh"
RATES=${RATES:-250,500,1000,2000,4000}; STAMPS=${STAMPS:-kernel,capture}; STAGE_S=${STAGE_S:-30}; HOSTS=${HOSTS:-1}
TRUTH_REALTIME=${TRUTH_REALTIME:-1}; STEP_TIMEOUT_S=${STEP_TIMEOUT_S:-300}; PY=${PY:-python3}; CPU_SPLIT=${CPU_SPLIT:-auto}
TAG=${TAG:-h$HOSTS-${STAMPS//,/+}-${RATES//,/+}}
export TAILGATE_HOME=${TAILGATE_HOME:-$OUT/home}
echo "cores $(nproc); $(uptime); tag $TAG"
"$PY" - <<'PY'
from tailgate.load.hostcapacity import host_capacity
print("calibration:", host_capacity().line(), flush=True)
PY
realtime=(); [ "$TRUTH_REALTIME" = 1 ] && realtime=(--truth-realtime)
"$PY" benchmarks/scale_host.py --rates "$RATES" --stamps "$STAMPS" --stage-s "$STAGE_S" --hosts "$HOSTS" \
  --step-timeout-s "$STEP_TIMEOUT_S" --cpu-split "$CPU_SPLIT" ${realtime[@]+"${realtime[@]}"} --out "$OUT/$TAG"
cp "$TAILGATE_HOME/calibration.json" "$OUT/$TAG/" 2>/dev/null
echo "$(uptime)"
