"""Duplicate groups from pairs: the connected components of a graph whose edges are the pairs."""

from __future__ import annotations

import numpy as np

from pipeline.clean.union_find import representatives


def components(n: int, pairs: np.ndarray) -> np.ndarray:
    """For each of ``n`` items, the smallest item of its component under the (k, 2) ``pairs``
    (a union-find over the items in pairs, :mod:`pipeline.clean.union_find`: beyond the answer,
    memory proportional to the pairs, never all pairs of a group)."""
    return representatives(n, pairs)
