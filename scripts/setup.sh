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

# the web UI test drives a real headless browser: Debian's chromium and its driver
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing chromium and chromium-driver from the OS packages"
    for attempt in 1 2 3 4 5 6 7 8 9 10; do  # another apt may hold the dpkg lock for a while
      if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
      then break; fi
      echo "[setup] apt is busy or failed (attempt $attempt); retrying in 15 s"
      sleep 15
    done
  fi
  command -v chromium >/dev/null 2>&1 || echo "[setup] no chromium: the web UI browser test will be skipped"
fi

# the distributed tests shift one worker's wall clock with Debian's libfaketime
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] && ! command -v faketime >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing faketime from the OS packages"
    for attempt in 1 2 3 4 5 6 7 8 9 10; do  # another apt may hold the dpkg lock for a while
      if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null \
        || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null)
      then break; fi
      echo "[setup] apt is busy or failed (attempt $attempt); retrying in 15 s"
      sleep 15
    done
  fi
  command -v faketime >/dev/null 2>&1 || echo "[setup] no faketime: the shifted-clock test will be skipped"
fi

echo "[setup] preparing the CPU vLLM and the tiny model (first time: a few minutes)"
.venv/bin/python - <<'PY'
from tailgate.servers import ensure_tiny_model, ensure_vllm_venv
python = ensure_vllm_venv(log=lambda line: print("[setup]", line, flush=True))
print("[setup] vLLM python:", python)
print("[setup] tiny model:", ensure_tiny_model(python=python))
PY
