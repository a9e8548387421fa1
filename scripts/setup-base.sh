#!/usr/bin/env bash
# What the embedded suite (scripts/run-embedded.sh) needs, and nothing else, idempotently:
#   .venv/                  the project (load generator, analysis) with its dev tools; re-installed only
#                           when pyproject.toml changed since the last install
#   prometheus              from the OS packages (root with apt-get), for the report's server series;
#                           without it the suite reads the server's /metrics itself
#   ~/.cache/tailgate/      the CPU build of vLLM in its own venv, and the tiny dummy-weight model
# No Docker tool is called, and nothing started here is left running (the Debian prometheus package's
# own service is stopped: the suite starts its own Prometheus for each run).
# --check: say what would be installed, install nothing. On disk afterwards: .venv about 0.5 GB, the vLLM venv
# about 3.5 GB; scripts/clean.sh lists them with their sizes, and removes them with --yes.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup-lib.sh

PY=${PYTHON:-python3}
stamp="$VENV/.tailgate-installed"
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -x "$VENV/bin/python" ]; then
  doing "creating $VENV"
  act "$PY" -m venv "$VENV"
fi
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  say "the project is installed in $VENV (pyproject.toml unchanged)"
else
  doing "installing the project into $VENV"
  act "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[dev]'
  [ "$SETUP_CHECK" = 1 ] || echo "$want" >"$stamp"
fi
if [ "$SETUP_CHECK" != 1 ]; then
  # `locust -f locustfiles/continuous.py --help` lists the suite's options too (tailgate/locusthelp.py says how)
  "$VENV/bin/python" -c 'import pathlib, sysconfig
from tailgate.locusthelp import PTH_LINE, PTH_NAME
pth = pathlib.Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
pth.exists() and pth.read_text() == PTH_LINE or pth.write_text(PTH_LINE)'
fi

if ! command -v prometheus >/dev/null 2>&1; then
  os_packages "the report reads the server from the load generator's direct /metrics samples" prometheus=prometheus
  if [ "$SETUP_CHECK" != 1 ] && command -v prometheus >/dev/null 2>&1; then
    # the Debian package starts a system service on :9090 that nothing here uses
    (systemctl stop prometheus 2>/dev/null || service prometheus stop 2>/dev/null || true) >/dev/null 2>&1
  fi
fi

if [ "$SETUP_CHECK" = 1 ]; then
  [ -x "$VENV/bin/python" ] || { say "would prepare the CPU vLLM and the tiny model once $VENV exists"; exit 0; }
  "$VENV/bin/python" - <<'PY'
from tailgate.servers.install import VLLM_SPEC, default_vllm_python, tailgate_home, vllm_importable

python = default_vllm_python()
if vllm_importable(python):
    print("[setup] vLLM python:", python)
else:
    print(f"[setup] would install {VLLM_SPEC} into {python.parent.parent} (a few minutes)")
model = tailgate_home() / "tiny-model"
if (model / "config.json").exists():
    print("[setup] tiny model:", model)
else:
    print(f"[setup] would build the tiny model in {model}")
PY
  say "what set-up has installed so far, with sizes: bash scripts/clean.sh (removes nothing without --yes)"
  exit 0
fi
say "the CPU vLLM and the tiny model (installed the first time: a few minutes; later an import check)"
"$VENV/bin/python" - <<'PY'
from tailgate.servers import ensure_tiny_model, ensure_vllm_venv
python = ensure_vllm_venv(log=lambda line: print("[setup]", line, flush=True))
print("[setup] vLLM python:", python)
print("[setup] tiny model:", ensure_tiny_model(python=python))
PY
