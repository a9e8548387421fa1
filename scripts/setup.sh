#!/usr/bin/env bash
# Everything the suite and its tests need on a fresh machine, idempotently: scripts/setup-base.sh (the
# project, Prometheus, the CPU vLLM and the tiny model: all the embedded run needs) then
# scripts/setup-test.sh (the tests' OS packages, Docker, compose and the CPU stack's images).
# --check: say what would be installed or started, do nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-base.sh "$@"
bash scripts/setup-test.sh "$@"
