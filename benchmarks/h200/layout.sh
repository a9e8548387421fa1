# Sourced by the device scripts: the checkout itself on PYTHONPATH (tailgate/__init__.py maps shapes/,
# locustfiles/ and postprocess/ under the tailgate namespace when nothing is installed), the carried wheels
# in /tmp/site after it. The device has no network for a build backend, so nothing is installed there.
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
