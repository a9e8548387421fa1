"""The bootstrap the analysis uses: its home is :mod:`tailgate.bootstrap` (numpy only), shared with ``slo``."""

from tailgate.bootstrap import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    Difference,
    bootstrap_percentile,
    bootstrap_percentile_naive,
    percentile_difference,
)

__all__ = [
    "DEFAULT_RESAMPLES",
    "DEFAULT_SEED",
    "Difference",
    "bootstrap_percentile",
    "bootstrap_percentile_naive",
    "percentile_difference",
]
