"""Gated arm: static batches of B behind a barrier.

    locust -f locustfiles/gated.py --headless --host http://127.0.0.1:8000 \
        --batch-size 16 --n 500 --results-dir results/chunked-gated
"""

import tailgate.load.hooks  # noqa: F401  (options, validation, messages)
from tailgate.load.worker import StreamingUser  # noqa: F401
from tailgate.shapes.gated import GatedBatches  # noqa: F401
