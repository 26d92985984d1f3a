"""``quality_bin``: tokens per quartile of the quality score (the quality stage's ``quality``
column, docs/quality.md), each quartile at its share of the tokens: every window of the stream
holds as much of the best-scoring quarter of the tokens as of the worst."""

from __future__ import annotations

from pipeline.errors import StrataInputError
from pipeline.ordering.families import TokenFamily
from pipeline.ordering.quantiles import BINS, token_quantile_bins


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
