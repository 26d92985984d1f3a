"""``quality.filter``: which scored documents leave training, with the reason ``quality``.

``threshold``: a document scoring below it leaves. ``keep_top`` s < 1: the best-scoring documents
(ties by doc_id) are kept until they hold a share s of the scored tokens (the document that
crosses the share is kept), the rest leave. Both given: a document leaves when either says so.
The documents the clean stage removes are scored and counted in the share like the others (the
two stages run side by side); a document both remove is counted under clean's reason, as the
packing applies clean's removals first."""

from __future__ import annotations

import numpy as np

REASON = "quality"


def removed_mask(scores: np.ndarray, tokens: np.ndarray, threshold: float | None, keep_top: float) -> np.ndarray:
    """(n,) bool: the documents the filter takes out of training."""
    scores, tokens = np.asarray(scores, np.float64), np.asarray(tokens, np.float64)
    gone = np.zeros(scores.size, bool)
    if threshold is not None:
        gone |= scores < threshold
    if keep_top < 1.0 and scores.size:
        order = np.lexsort((np.arange(scores.size), -scores))  # best first, ties by doc_id
        before = np.cumsum(tokens[order]) - tokens[order]  # tokens of the better documents
        gone[order[before >= keep_top * tokens.sum()]] = True
    return gone
