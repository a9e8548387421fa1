#!/usr/bin/env bash
# Installs everything the tests need (scripts/setup.sh: setup-base.sh, then setup-test.sh), then runs them
# in two passes, each printing why any test was skipped (-rs):
#   1. all of them: unit, behaviour against small fake servers, integration against a real CPU vLLM,
#      Prometheus and Locust;
#   2. the fast tests that start processes or depend on timing (no vLLM, no Prometheus; not the pure
#      analysis, fuzzing, report and fitted-model tests, which only cost CPU, nor the browser walk-throughs of the web UI
#      and the report, which pass 1 runs and which cost minutes of the budget under load) again with both
#      cores kept busy by `stress-ng --cpu 2`, so a test that only passes on an idle machine fails here
#      rather than on a busy CI runner.
# About 30 minutes on 2 cores with everything installed, about 40 on a fresh machine (the set-up's CPU vLLM,
# OS packages and Docker images); README, "Two commands", says what each part costs.
# TAILGATE_TEST_STRESS=0 skips pass 2; arguments go to pass 1 (e.g. a test file, -k, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m mypy
.venv/bin/python -m pytest -q -rs -p no:cacheprovider --durations=15 "$@"

if [ "${TAILGATE_TEST_STRESS:-1}" != 0 ] && [ $# -eq 0 ]; then
  if ! command -v stress-ng >/dev/null 2>&1; then
    echo "[test] stress-ng is not installed: the pass under load cannot run" >&2
    exit 1
  fi
  echo "[test] the fast tests again, under stress-ng --cpu 2"
  # bounded by its own timeout too, so nothing outlives this script even if the trap never runs
  stress-ng --cpu 2 --timeout 900s --quiet &
  stress=$!
  trap 'kill "$stress" 2>/dev/null || true; wait "$stress" 2>/dev/null || true' EXIT
  start=$(date +%s)
  .venv/bin/python -m pytest -q -rs -p no:cacheprovider -m "not vllm and not prometheus and not docker" --durations=5 \
    --ignore=tests/test_postprocess.py --ignore=tests/test_fuzz.py --ignore=tests/test_prometheus_pull.py \
    --ignore=tests/test_webui.py --ignore=tests/test_report_browser.py --ignore=tests/test_slo_replay.py \
    --ignore=tests/test_slo_confirm.py --ignore=tests/test_webui_access.py
  echo "[test] under load: passed in $(( $(date +%s) - start )) s"
fi
