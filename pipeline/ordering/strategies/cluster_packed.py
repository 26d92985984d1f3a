"""``cluster_packed``: Don't Shuffle, Optimize's minimum-diversity baseline — each cluster's
documents packed together, the sequences shuffled."""

from __future__ import annotations

import numpy as np

from pipeline.ordering.strategies import StrategySpec


def run(inp):
    from pipeline.ordering.engine import OrderingResult, order_frame, repack

    docs = inp.present[np.lexsort((inp.present, inp.cluster[inp.present]))]
    seg = repack(inp, docs)
    ids = np.unique(seg["sequence_id"].to_numpy())
    return OrderingResult(order_frame(ids[np.random.default_rng(inp.seed).permutation(ids.size)]), seg)


SPECS = (
    StrategySpec("cluster_packed", "document", "documents packed cluster by cluster, sequences shuffled (minimum diversity baseline)",
                 seed_free=False, run=run),
)
