"""``concentration``: quantile classes of ||c_s||_2 / l_s (1 for a single-cluster sequence, 1/sqrt(n)
for one spread evenly over n clusters), each class at its share of the sequences."""

from __future__ import annotations

from pipeline.ordering.characteristics import concentration
from pipeline.ordering.families import SequenceFamily


class Concentration(SequenceFamily):
    name = "concentration"
    description = "quantile classes of ||c_s||_2 / l_s, each at its share of the sequences"

    def values(self, features):
        return concentration(features)


SPECS = (Concentration(),)
