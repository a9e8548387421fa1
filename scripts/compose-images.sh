#!/usr/bin/env bash
# Builds the CPU compose stack's images (docker-compose.cpu.yml) with `docker build --network host`:
#   tailgate/vllm-cpu:local         the CPU vLLM and the tiny dummy-weight model
#   tailgate/prometheus-cpu:local   Prometheus from the OS package
# from BASE_IMAGE. Unset, the base is made here when debootstrap is installed (no image registry
# needed): a minimal Debian of this machine's release from its configured apt mirror, imported as
# tailgate/debian-base:<release>; without debootstrap it is debian:bookworm-slim, pulled as usual.
#
# The vLLM image installs every wheel from .cache/docker/wheels when that folder holds them: this
# machine's pip fills it (`pip download`, from its own caches and indexes, a CPU torch where the machine
# has one), so the build needs no index and gets the set the embedded server runs.
# TAILGATE_IMAGE_WHEELS=0 leaves the folder empty and lets the build install from PyPI.
# Images built from the same inputs are kept: TAILGATE_REBUILD_IMAGES=1 builds them again.
# Nothing untagged is left behind: after each build the untagged images carrying the project's labels (the
# vLLM image's install stage, org.tailgate.stage; a previous build of an image, org.tailgate.inputs) are
# removed, and no other image is touched. scripts/clean.sh lists and removes the images themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_IMAGE=${TAILGATE_VLLM_CPU_IMAGE:-tailgate/vllm-cpu:local}
PROM_IMAGE=${TAILGATE_PROMETHEUS_CPU_IMAGE:-tailgate/prometheus-cpu:local}
say() { echo "[images] $*"; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

docker info >/dev/null 2>&1 || { echo "[images] ERROR: the Docker engine is not running (scripts/setup.sh starts it)" >&2; exit 1; }

release=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
if [ -z "${BASE_IMAGE:-}" ]; then
  if [ -n "$release" ] && command -v debootstrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    BASE_IMAGE=tailgate/debian-base:$release
    if ! have_image "$BASE_IMAGE"; then
      # the first Debian mirror apt is configured with (deb822 or one-line sources)
      mirror=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list \
                 /etc/apt/sources.list | grep -v security | grep -oE 'https?://[^ ]+' | head -n 1 || true)
      mirror=${mirror:-http://deb.debian.org/debian}
      root=$(mktemp -d)
      say "making $BASE_IMAGE: debootstrap --variant=minbase $release from $mirror"
      start=$(date +%s)
      if ! debootstrap --variant=minbase "$release" "$root" "$mirror" >"$root.log" 2>&1; then
        echo "[images] ERROR: debootstrap failed; its last lines:" >&2
        tail -n 20 "$root.log" >&2
        rm -rf "$root" "$root.log"
        exit 1
      fi
      rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
      tar -C "$root" -c . | docker import - "$BASE_IMAGE" >/dev/null
      rm -rf "$root" "$root.log"
      say "$BASE_IMAGE made in $(( $(date +%s) - start )) s"
    fi
  else
    BASE_IMAGE=debian:bookworm-slim
  fi
fi
say "base image: $BASE_IMAGE"

mkdir -p .cache/docker/wheels .cache/docker-logs
rm -f .cache/docker/ca.pem
# a TLS-inspecting proxy's CA, where this machine trusts one, for pip inside the build
[ -s /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt .cache/docker/ca.pem

base_id=$(docker image inspect --format '{{.Id}}' "$BASE_IMAGE" 2>/dev/null || echo "$BASE_IMAGE")
# What an image is built from: its Dockerfile, the files it copies (the install code names the vLLM
# version) and the base. An image labelled with the same digest is current and kept.
inputs() {  # dockerfile
  { echo "$base_id"; cat "$1" deploy/cpu/*.sh tailgate/servers/base.py tailgate/servers/net.py \
      tailgate/servers/install.py tailgate/servers/tinymodel.py; } | sha256sum | cut -c1-16
}
current() {  # image dockerfile
  [ "${TAILGATE_REBUILD_IMAGES:-0}" != 1 ] && have_image "$1" &&
    [ "$(docker image inspect --format '{{index .Config.Labels "org.tailgate.inputs"}}' "$1")" = "$(inputs "$2")" ]
}

build() {  # image dockerfile
  if current "$1" "$2"; then
    say "$1 is current (built from the same files and base; TAILGATE_REBUILD_IMAGES=1 builds it again)"
    return 0
  fi
  local start log
  start=$(date +%s)
  mkdir -p .cache/docker-logs
  log=.cache/docker-logs/build-$(basename "$2").log
  say "building $1 from $2 (log: $log)"
  if ! docker build --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" --label "org.tailgate.inputs=$(inputs "$2")" \
      -f "$2" -t "$1" . >"$log" 2>&1; then
    echo "[images] ERROR: building $1 failed; the end of $log:" >&2
    tail -n 30 "$log" >&2
    prune_own
    exit 1
  fi
  say "$1 built in $(( $(date +%s) - start )) s, $(docker image inspect --format '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1/1e6}')"
  prune_own
}

# prune_own: remove the untagged images only this script makes (each label filter on its own: filters AND)
prune_own() {
  local label
  for label in org.tailgate.stage org.tailgate.inputs; do
    docker image prune -f --filter "label=$label" >/dev/null 2>&1 || say "could not remove untagged $label images"
  done
}

build "$PROM_IMAGE" deploy/cpu/Dockerfile.prometheus

if ! current "$VLLM_IMAGE" deploy/cpu/Dockerfile.vllm; then
  if [ "${TAILGATE_IMAGE_WHEELS:-1}" = 1 ]; then
    spec=$(sed -n 's/^VLLM_SPEC = "\(.*\)"$/\1/p' tailgate/servers/install.py)
    py=${TAILGATE_WHEELS_PYTHON:-python3}
    # the image's interpreter is the base's python3 (3.11 on bookworm): wheels for another version would not install
    if [ "$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = 3.11 ]; then
      say "collecting the wheels of $spec with this machine's pip into .cache/docker/wheels"
      start=$(date +%s)
      "$py" -m pip download -q --disable-pip-version-check -d .cache/docker/wheels "$spec" \
        >.cache/docker-logs/pip-download.log 2>&1 \
        || { echo "[images] ERROR: pip download $spec failed; see .cache/docker-logs/pip-download.log" >&2; exit 1; }
      say "wheels ready in $(( $(date +%s) - start )) s ($(du -sh .cache/docker/wheels | cut -f1))"
    else
      say "$py is not Python 3.11: the build installs from PyPI"
      rm -f .cache/docker/wheels/*
    fi
  else
    rm -f .cache/docker/wheels/*
  fi
fi
build "$VLLM_IMAGE" deploy/cpu/Dockerfile.vllm
