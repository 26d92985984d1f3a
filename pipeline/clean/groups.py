"""Duplicate groups from pairs: the connected components of a graph whose edges are the pairs."""

from __future__ import annotations

import numpy as np

from pipeline.heavy import lazy

sparse = lazy("scipy.sparse")  # imported on first use (pipeline/heavy.py)
csgraph = lazy("scipy.sparse.csgraph")


def components(n: int, pairs: np.ndarray) -> np.ndarray:
    """For each of ``n`` items, the smallest item of its component under the (k, 2) ``pairs``
    (scipy's connected components: memory linear in ``n`` and the pairs, never all pairs)."""
    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    if not pairs.size:
        return np.arange(n, dtype=np.int64)
    graph = sparse.coo_matrix((np.ones(pairs.shape[0], np.int8), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    _, label = csgraph.connected_components(graph, directed=False)
    first = np.full(int(label.max()) + 1, n, np.int64)
    np.minimum.at(first, label, np.arange(n, dtype=np.int64))
    return first[label]
