"""Static batches of B (16 by default) in trace order, behind a barrier.

All B requests of a batch go out together; the first request of batch k+1 is sent only after
every request of batch k has ended, whether it succeeded, failed or timed out. That is
admission by construction: a closed loop, on purpose.
"""

from __future__ import annotations

from .base import SuiteShape


class GatedBatches(SuiteShape):
    arm = "gated"
