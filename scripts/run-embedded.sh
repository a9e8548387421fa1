#!/usr/bin/env bash
# The whole suite on this machine, no GPU and no Docker needed: a CPU vLLM with a tiny
# dummy-weight model, a scaled-down experiment, and an HTML report at the end.
# Extra arguments go to `tailgate suite` (e.g. --results results/my-run to resume one).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tailgate suite --embedded "$@"
