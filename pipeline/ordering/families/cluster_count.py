"""``cluster_count``: quantile classes of the number of distinct clusters in a sequence, each class at
its share of the sequences."""

from __future__ import annotations

import numpy as np

from pipeline.ordering.families import SequenceFamily


class ClusterCount(SequenceFamily):
    name = "cluster_count"
    description = "quantile classes of the distinct clusters per sequence, each at its share of the sequences"

    def values(self, features):
        return np.diff(features.clusters.indptr)


SPECS = (ClusterCount(),)
