#!/usr/bin/env bash
# Installs what the suite and its tests need on a fresh machine, idempotently:
#   .venv/                  the project (load generator, analysis) with its dev tools
#   ~/.cache/tailgate/      the CPU build of vLLM in its own venv, and the tiny dummy-weight model
#   prometheus              from the OS packages, when this user can install them (optional)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
echo "[setup] installing the project into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'

if ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing prometheus from the OS packages"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null) \
      || echo "[setup] prometheus could not be installed; reports will use direct /metrics reads"
    # the Debian package starts a system service on :9090 that nothing here uses
    (systemctl stop prometheus 2>/dev/null || service prometheus stop 2>/dev/null || true) >/dev/null 2>&1
  else
    echo "[setup] no prometheus and no way to install it; reports will use direct /metrics reads"
  fi
fi

echo "[setup] preparing the CPU vLLM and the tiny model (first time: a few minutes)"
.venv/bin/python - <<'PY'
from tailgate.servers import ensure_tiny_model, ensure_vllm_venv
python = ensure_vllm_venv(log=lambda line: print("[setup]", line, flush=True))
print("[setup] vLLM python:", python)
print("[setup] tiny model:", ensure_tiny_model(python=python))
PY
