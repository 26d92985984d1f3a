"""Connected components of a pair graph by union-find over the ids that appear in a pair: memory
proportional to the pairs (the duplicates), never to the documents."""

from __future__ import annotations

import numpy as np


def pair_components(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The connected components of the graph whose edges are ``pairs`` ((k, 2) ids): the ids that
    appear in a pair, ascending, and for each the smallest id of its component.

    A union-find over those ids alone (sorted, so an id's slot is a binary search away): every
    round hooks the root of each edge's larger side onto the smaller root, then compresses every
    path to its root, until no edge joins two roots. Roots only ever move to smaller slots, so the
    root of a component is its smallest id; memory is a few arrays of the pairs' size."""
    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    ids, slot = np.unique(pairs, return_inverse=True)
    slot = slot.reshape(-1, 2)
    u, v = slot[:, 0], slot[:, 1]
    parent = np.arange(ids.size, dtype=np.int64)
    while True:
        ru, rv = parent[u], parent[v]
        apart = ru != rv
        if not apart.any():
            break
        lo, hi = np.minimum(ru, rv)[apart], np.maximum(ru, rv)[apart]
        np.minimum.at(parent, hi, lo)  # hi is a root (paths are compressed): it hangs under its smallest neighbour root
        while True:  # path compression: every slot points at its root
            up = parent[parent]
            if np.array_equal(up, parent):
                break
            parent = up
    return ids, ids[parent]


def representatives(n: int, pairs: np.ndarray) -> np.ndarray:
    """For each of ``n`` documents, the smallest doc id of its component under ``pairs`` (itself
    when it is in none): :func:`pipeline.clean.groups.components`' answer from :func:`pair_components`."""
    out = np.arange(n, dtype=np.int64)
    ids, rep = pair_components(pairs)
    out[ids] = rep
    return out
