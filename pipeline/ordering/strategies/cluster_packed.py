"""``cluster_packed``: Don't Shuffle, Optimize's minimum-diversity baseline — each cluster's
documents packed together, the sequences shuffled."""

from __future__ import annotations

import numpy as np

from pipeline.ordering.strategies import StrategySpec


def run(inp):
    from pipeline.ordering.engine import OrderingResult, order_frame, repack

    # by cluster, then by doc id: ``present`` is ascending, so a stable sort by cluster alone gives
    # that order (a radix sort for 16-bit clusters: 0.4 s for 9.8M documents against 0.9 s for the lexsort)
    clusters = inp.cluster[inp.present]
    docs = inp.present[np.argsort(clusters.astype(np.int16) if inp.cluster.max(initial=0) < 2**15 else clusters, kind="stable")]
    seg = repack(inp, docs)
    ids = np.flatnonzero(np.bincount(seg["sequence_id"].to_numpy()))  # the sequence ids, ascending (np.unique, in one pass)
    return OrderingResult(order_frame(ids[np.random.default_rng(inp.seed).permutation(ids.size)]), seg)


SPECS = (
    StrategySpec("cluster_packed", "document", "documents packed cluster by cluster, sequences shuffled (minimum diversity baseline)",
                 seed_free=False, run=run),
)
