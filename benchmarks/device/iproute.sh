#!/usr/bin/env bash
# iproute2's `ip` for a host that lacks it (the GPU host has none; `selfcheck --hosts 2` needs `ip netns`):
#   here:       bash benchmarks/device/iproute.sh pack .gpu/iproute      # the binary and the libraries it loads
#   there:      bash benchmarks/device/iproute.sh install .gpu/iproute && export PATH=/tmp/iproute/bin:$PATH
# The wrapper runs the copied binary through the host's loader with the copied libraries' path, which the
# commands `ip netns exec` starts do not inherit. Carry the folder in the same call that uses it.
set -euo pipefail
mode=${1:?pack or install}; dir=${2:?folder}
case $mode in
  pack)
    mkdir -p "$dir/bin" "$dir/lib"
    ip=$(command -v ip); cp -L "$ip" "$dir/bin/ip"
    ldd "$ip" | awk '/=> \// {print $3}' | grep -Ev '/(libc|libz|libm)\.so' | while read -r lib; do cp -L "$lib" "$dir/lib/"; done
    du -sh "$dir" ;;
  install)
    here=$(cd "$dir" && pwd)
    mkdir -p /tmp/iproute/bin
    printf '#!/bin/sh\nexec /lib64/ld-linux-x86-64.so.2 --library-path %s/lib %s/bin/ip "$@"\n' "$here" "$here" \
      > /tmp/iproute/bin/ip
    chmod +x /tmp/iproute/bin/ip
    /tmp/iproute/bin/ip -V ;;
  *) echo "iproute.sh: pack or install, not $mode" >&2; exit 2 ;;
esac
