"""Gated arm: static batches of B behind a barrier.

    locust -f locustfiles/gated.py --headless --host http://127.0.0.1:8000 \
        --batch-size 16 --n 500 --results-dir results/chunked-gated
"""

import tailgate.locust_hooks  # noqa: F401  (options, validation, messages)
from shapes.gated import GatedBatches  # noqa: F401
from tailgate.worker import StreamingUser  # noqa: F401
