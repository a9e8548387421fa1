#!/usr/bin/env bash
# What the set-up scripts left on this machine, each item with its size, and with --yes removed:
#   .venv/                          the project and its tools (TAILGATE_PROJECT_VENV)
#   ~/.cache/tailgate/              the CPU vLLM's venv, the tiny model, server logs, the calibration (TAILGATE_HOME)
#   .cache/docker/, .cache/docker-logs/   the wheels and logs of the image build
#   Docker images                   tailgate/vllm-cpu:local, tailgate/prometheus-cpu:local, tailgate/debian-base:*,
#                                   and untagged images with the project's labels (org.tailgate.*)
#   the docker compose plugin       only when scripts/setup-test.sh installed it (its note in ~/.cache/tailgate)
#   a dockerd set-up started        stopped, only that one (its note in ~/.cache/tailgate), and its log
# Only the project's own paths and images: OS packages, a Debian image pulled from a registry, pip's own
# cache and results/ are left as they are (the last lines say so).
# Without arguments it lists and removes nothing; --yes removes what it lists.
set -euo pipefail
cd "$(dirname "$0")/.."

YES=0
for arg in "$@"; do
  case "$arg" in
    --yes) YES=1 ;;
    -h|--help) sed -n '2,/^set -/p' "$0" | sed -e '/^set -/d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "[clean] unknown argument $arg (only --yes)" >&2; exit 2 ;;
  esac
done

VENV=${TAILGATE_PROJECT_VENV:-.venv}
TG_HOME=${TAILGATE_HOME:-$HOME/.cache/tailgate}
LEDGER=$TG_HOME/setup-ledger
VLLM_IMAGE=${TAILGATE_VLLM_CPU_IMAGE:-tailgate/vllm-cpu:local}
PROM_IMAGE=${TAILGATE_PROMETHEUS_CPU_IMAGE:-tailgate/prometheus-cpu:local}
DOCKER_LOG=${TAILGATE_DOCKERD_LOG:-/var/log/tailgate-dockerd.log}

say() { echo "[clean] $*"; }
verb() { if [ "$YES" = 1 ]; then echo "removing"; else echo "would remove"; fi; }
size() { du -sh "$1" 2>/dev/null | cut -f1; }
found=0

# path PATH WHAT: one folder or file of the project's own
path() {
  [ -e "$1" ] || [ -L "$1" ] || return 0
  found=1
  say "$(verb) $1 ($(size "$1")): $2"
  [ "$YES" = 1 ] && rm -rf -- "$1"
  return 0
}

# noted NAME: what set-up wrote down about an item it installed or started (empty when nothing)
noted() { cat "$LEDGER/$1" 2>/dev/null || true; }

# Read the notes first: removing ~/.cache/tailgate removes them.
compose_plugin=$(noted compose-plugin)
dockerd_pid=$(noted dockerd)

# Docker first: it needs the engine, which may be the dockerd set-up started.
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  images=()
  for ref in "$VLLM_IMAGE" "$PROM_IMAGE" "tailgate/debian-base"; do
    while IFS=$'\t' read -r name id sz; do
      [ -n "$name" ] || continue
      found=1
      say "$(verb) image $name ($sz)"
      images+=("$name")
    done < <(docker image ls --filter "reference=$ref" --format '{{.Repository}}:{{.Tag}}{{"\t"}}{{.ID}}{{"\t"}}{{.Size}}')
  done
  for label in org.tailgate.stage org.tailgate.inputs; do
    while IFS=$'\t' read -r id sz; do
      [ -n "$id" ] || continue
      found=1
      say "$(verb) untagged image $id ($sz, label $label: a build stage or an earlier build)"
      images+=("$id")
    done < <(docker image ls --filter dangling=true --filter "label=$label" --format '{{.ID}}{{"\t"}}{{.Size}}')
  done
  if [ "$YES" = 1 ] && [ ${#images[@]} -gt 0 ]; then
    docker image rm "${images[@]}" >/dev/null ||
      say "some images are still in use: stop the stack (docker compose -f docker-compose.cpu.yml --profile cpu down) and run this again"
  fi
else
  say "no Docker engine answers here: no image is listed (start it and run this again to see them)"
fi

if [ -n "$compose_plugin" ]; then
  path "$compose_plugin" "the docker compose plugin scripts/setup-test.sh installed"
fi
if [ -n "$dockerd_pid" ] && [ "$(cat "/proc/$dockerd_pid/comm" 2>/dev/null)" = dockerd ]; then
  found=1
  if [ "$YES" = 1 ]; then
    say "stopping dockerd (process $dockerd_pid, started by scripts/setup-test.sh)"
    kill "$dockerd_pid"
    for _ in $(seq 1 30); do
      [ -d "/proc/$dockerd_pid" ] || break
      sleep 1
    done
  else
    say "would stop dockerd (process $dockerd_pid, started by scripts/setup-test.sh)"
  fi
fi
[ -n "$dockerd_pid" ] && path "$DOCKER_LOG" "the log of the dockerd set-up started"

path .cache/docker "the image build's wheels (pip download) and CA file"
path .cache/docker-logs "the image build's logs"
[ "$YES" = 1 ] && rmdir .cache 2>/dev/null || true
path "$TG_HOME/vllm-venv" "the CPU build of vLLM (scripts/setup-base.sh)"
path "$TG_HOME/tiny-model" "the tiny dummy-weight model"
path "$TG_HOME/logs" "the CPU vLLM's server logs"
path "$TG_HOME/vllm-install.log" "pip's output from the vLLM install"
path "$TG_HOME/.vllm-install.lock" "the vLLM install's lock file"
path "$TG_HOME/calibration.json" "this host's calibration for --processes auto (measured again when missing)"
path "$LEDGER" "set-up's notes of what it installed and started"
[ "$YES" = 1 ] && rmdir "$TG_HOME" 2>/dev/null || true
path "$VENV" "the project's venv with its tools"

[ "$found" = 1 ] || say "nothing of the set-up's is left here"
pip_cache=${PIP_CACHE_DIR:-$HOME/.cache/pip}
[ -d "$pip_cache" ] && say "left: pip's own cache $pip_cache ($(size "$pip_cache")), shared with other projects (pip cache purge)"
say "left: OS packages (prometheus, docker.io, chromium, ...), results/, and any image pulled from a registry"
[ "$YES" = 1 ] || say "nothing removed; bash scripts/clean.sh --yes removes the items above"
