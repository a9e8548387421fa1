#!/usr/bin/env bash
# Installs everything the tests need (see setup.sh), then runs them all: unit, behaviour
# against small fake servers, and integration against a real CPU vLLM, Prometheus and Locust.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@"
