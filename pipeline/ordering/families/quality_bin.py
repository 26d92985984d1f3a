"""``quality_bin``: tokens per quartile of the quality score (the quality stage's ``quality``
column, docs/quality.md), each quartile at its share of the tokens: every window of the stream
holds as much of the best-scoring quarter of the tokens as of the worst."""

from __future__ import annotations

import numpy as np

from pipeline.errors import StrataInputError
from pipeline.ordering.families import TokenFamily

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


class QualityBin(TokenFamily):
    name = "quality_bin"
    description = "tokens per token quartile of the quality score (the quality stage's column), each at its share of the tokens"
    column = "quality"

    def codes(self, docs):
        return token_quantile_bins(docs["quality"].fill_null(float("nan")).to_numpy(), docs["n_tokens"].to_numpy(), BINS)

    def tokens(self, features):
        if self.name not in features.columns:
            raise StrataInputError("no quality scores for these sequences (the family quality_bin reads the documents' quality)",
                                   fix="enable the quality stage (quality.enabled, docs/quality.md) and materialize quality")
        return features.columns[self.name]


SPECS = (QualityBin(),)
