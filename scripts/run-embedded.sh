#!/usr/bin/env bash
# The whole suite on this machine, no GPU and no Docker: a CPU vLLM with a tiny dummy-weight model, a
# scaled-down experiment, and an HTML report at the end. Installs only what that needs
# (scripts/setup-base.sh: no Docker tool is called). Extra arguments go to `tailgate suite`
# (e.g. --results results/suite-<time> --resume continues an interrupted run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-base.sh
exec "${TAILGATE_PROJECT_VENV:-.venv}/bin/tailgate" suite --embedded "$@"
