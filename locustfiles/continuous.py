"""Continuous arm: open-loop Poisson arrivals over a rate ramp.

    locust -f locustfiles/continuous.py --headless --host http://127.0.0.1:8000 \
        --rates 1,5,10,20 --n 500 --results-dir results/chunked-continuous
"""

import tailgate.load.hooks  # noqa: F401  (options, validation, messages)
from tailgate.load.worker import StreamingUser  # noqa: F401
from tailgate.shapes.continuous import ContinuousRamp  # noqa: F401
