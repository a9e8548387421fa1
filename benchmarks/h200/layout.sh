# Sourced by the device scripts: the installed layout of this source tree, built by copying.
# pyproject.toml installs shapes/, locustfiles/ and postprocess/ as tailgate.shapes, tailgate.locustfiles and
# tailgate.postprocess; the device has no network for a build backend, so the same layout is copied into
# $TG_TREE (default /tmp/tg) and put first on PYTHONPATH, with the carried wheels in /tmp/site after it.
T=${TG_TREE:-/tmp/tg}
rm -rf "$T" && mkdir -p "$T/tailgate" && cp -r tailgate/. "$T/tailgate/" \
  && for d in shapes locustfiles postprocess; do cp -r "$d" "$T/tailgate/$d"; done || { echo "layout: copy failed"; exit 1; }
export PYTHONPATH=$T:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
