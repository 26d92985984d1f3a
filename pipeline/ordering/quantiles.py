"""Token quantile bins of a numeric documents column: the quality score's (family ``quality_bin``)
and any declared corpus column's (``corpus.columns`` named as a family)."""

from __future__ import annotations

import numpy as np

BINS = 4  # token quartiles of the score


def token_quantile_bins(values: np.ndarray, tokens: np.ndarray, bins: int) -> np.ndarray:
    """Each document's bin 0..bins-1 (0 the lowest scores): the documents in ascending score (ties
    by row) cut where their cumulative tokens cross each 1/bins, a document in the bin of its middle token."""
    v, t = np.asarray(values, np.float64), np.asarray(tokens, np.float64)
    order = np.lexsort((np.arange(v.size), v))
    total = max(float(t.sum()), 1.0)
    mid = (np.cumsum(t[order]) - t[order] / 2) / total
    out = np.empty(v.size, np.int64)
    out[order] = np.minimum((mid * bins).astype(np.int64), bins - 1)
    return out
