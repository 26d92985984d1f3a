"""``documents``: quantile classes of the number of document spans in a sequence, each class at its
share of the sequences."""

from __future__ import annotations

import numpy as np

from pipeline.ordering.families import SequenceFamily


class Documents(SequenceFamily):
    name = "documents"
    description = "quantile classes of the document spans per sequence, each at its share of the sequences"

    def values(self, features):
        return np.ones(features.n_sequences) if features.spans is None else features.spans


SPECS = (Documents(),)
