# Shared by scripts/setup-base.sh and scripts/setup-test.sh (sourced, not run).
#
# --check (or TAILGATE_SETUP_CHECK=1): every decision is taken as in a real run, but each install step
# is printed ("would ...") instead of done, so what a command would install can be seen, and tested,
# in seconds without touching the machine.

SETUP_CHECK=${TAILGATE_SETUP_CHECK:-0}
for arg in "$@"; do
  case "$arg" in
    --check) SETUP_CHECK=1 ;;
    -h|--help) sed -n '2,/^set -/p' "$0" | sed -e '/^set -/d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "[setup] unknown argument $arg (only --check)" >&2; exit 2 ;;
  esac
done
export TAILGATE_SETUP_CHECK=$SETUP_CHECK

say() { echo "[setup] $*"; }

# doing WHAT: announce the install step that follows; in check mode that step's own "would run" line says it
doing() {
  [ "$SETUP_CHECK" = 1 ] || say "$*"
}

# act CMD...: run one install step, or in check mode say it would
act() {
  if [ "$SETUP_CHECK" = 1 ]; then
    say "would run: $*"
  else
    "$@"
  fi
}

# The project's own virtual environment (TAILGATE_PROJECT_VENV, .venv by default)
VENV=${TAILGATE_PROJECT_VENV:-.venv}

# Where the CPU vLLM, the tiny model and server logs go (tailgate/servers/install.py: tailgate_home())
TG_HOME=${TAILGATE_HOME:-$HOME/.cache/tailgate}

# What set-up put outside the project's own folders (a compose plugin, a dockerd it started) is written down
# here, one file per item, so scripts/clean.sh removes exactly that and never a tool the machine already had.
LEDGER=$TG_HOME/setup-ledger

# remember NAME VALUE: note one such item (not in check mode)
remember() {
  [ "$SETUP_CHECK" = 1 ] && return 0
  mkdir -p "$LEDGER" && printf '%s\n' "$2" >"$LEDGER/$1"
}

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

# os_packages "why" TOOL=PACKAGE...: install the packages whose tool is not on PATH (root with apt-get).
# A package that cannot be installed by a user who can install packages is an error, said loudly with
# apt's own output: a CI run that silently skipped its Prometheus tests proves nothing.
os_packages() {
  local why=$1 pair tool missing=() tools=()
  shift
  for pair in "$@"; do
    tool=${pair%%=*}
    command -v "$tool" >/dev/null 2>&1 || { missing+=("${pair#*=}"); tools+=("$tool"); }
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "${missing[*]} missing and no way to install them here (not root with apt-get): $why"
    return 0
  fi
  if [ "$SETUP_CHECK" = 1 ]; then
    say "would install ${missing[*]} from the OS packages (apt-get)"
    return 0
  fi
  say "installing ${missing[*]} from the OS packages"
  apt_retry update || { echo "[setup] ERROR: cannot update the package lists" >&2; exit 1; }
  apt_retry install "${missing[@]}" || { echo "[setup] ERROR: cannot install ${missing[*]}" >&2; exit 1; }
  for tool in "${tools[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "[setup] ERROR: $tool installed but not on PATH" >&2; exit 1; }
  done
}
