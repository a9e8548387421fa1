#!/usr/bin/env bash
# The load path's wheels (Locust, gevent and what they import) into /tmp/site on the GPU machine, from a carried
# folder of Python 3.12 wheels (default .wheels312: `pip download --python-version 3.12 --only-binary :all: -d
# .wheels312 locust==2.47.0 orjson psutil` here). The vLLM bundle does not hold them, and a search that starts
# the server before finding Locust missing costs the server's start (~2 minutes of device time) for nothing.
# zope.event and zope.interface share the `zope` namespace: pip --target would replace the folder with each one,
# so they are unpacked instead.
#
#   carry [.gpu/s, .wheels312]:  bash benchmarks/h200/loadpath.sh [WHEEL_DIR]
set -euo pipefail
dir=${1:-.wheels312}
ls "$dir"/*.whl >/dev/null 2>&1 || { echo "loadpath: no wheels in $dir (carry it in this call)"; exit 2; }
mkdir -p /tmp/site
mapfile -t plain < <(ls "$dir"/*.whl | grep -v '/zope')
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site --upgrade "${plain[@]}"
for w in "$dir"/zope*.whl; do
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/site')" "$w"
done
source "$(dirname "$0")/layout.sh"
python3 -c "import locust, gevent, zope.event, zope.interface; print('load path: locust', locust.__version__)"
