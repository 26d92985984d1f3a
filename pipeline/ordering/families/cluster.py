"""``cluster``: tokens per cluster, c_{s,j} (Don't Shuffle, Optimize's f1; every preset's first family)."""

from __future__ import annotations

from pipeline.ordering.families import TokenFamily


class Cluster(TokenFamily):
    name = "cluster"
    description = "tokens per cluster c_{s,j}, each cluster at its share of the tokens (f1)"
    repaired = True
    diagnosed = "clusters"

    def tokens(self, features):
        return features.clusters

    def composition(self, schedule):
        return schedule.clusters


SPECS = (Cluster(),)
