"""``length_bin``: tokens per quantile bin of document length, l_{s,b} (Don't Shuffle, Optimize's f3).

The bins are the features' (``length_bins`` of them, quantiles weighted by ``length_bin_weighting``:
``pipeline.ordering.features.length_bin_edges``)."""

from __future__ import annotations

from pipeline.ordering.families import TokenFamily


class LengthBin(TokenFamily):
    name = "length_bin"
    description = "tokens per quantile bin of document length l_{s,b}, each bin at its share of the tokens (f3)"
    repaired = True
    diagnosed = "length_bins"

    def tokens(self, features):
        return features.bins

    def composition(self, schedule):
        return schedule.bins


SPECS = (LengthBin(),)
