"""Which prompts count as long: one rule for chart 3 and the diagnosis.

Chart 3 marks long-prompt arrivals and question 2 asks whether streams stalled while a long prompt
was prefilling. If the two used different cut-offs, the chart would show dashed lines at requests
the diagnosis does not count, and a reader could not check one against the other.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

LONG_PROMPT_TOKENS = 6000
"""The seed trace's long class (6000 prompt tokens, 10% of requests)."""


def long_prompt_threshold(prompt_tokens: pd.Series | np.ndarray) -> float:
    """≥ 6000 tokens when such prompts exist, else the largest class; ``inf`` (nothing is long) when the
    stage has a single prompt length, since a prompt cannot be long compared with itself."""
    p = pd.to_numeric(pd.Series(np.asarray(prompt_tokens)), errors="coerce").dropna()
    if p.empty or p.nunique() < 2:
        return float("inf")
    return float(LONG_PROMPT_TOKENS) if (p >= LONG_PROMPT_TOKENS).any() else float(p.max())


__all__ = ["LONG_PROMPT_TOKENS", "long_prompt_threshold"]
