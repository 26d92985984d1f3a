"""``cluster_packed``: Don't Shuffle, Optimize's minimum-diversity baseline — each cluster's
documents packed together, the sequences shuffled."""

from __future__ import annotations

import numpy as np

from pipeline.ordering.engine import OrderingResult, order_frame, repack
from pipeline.ordering.strategies import StrategySpec
from pipeline.segments import ids_by_key


def run(inp):

    # the present documents (cluster >= 0) by cluster, then by doc id: a counting sort on every core
    # (the documents are already in doc-id order, so counting keeps it; numpy's stable sort is serial)
    docs = ids_by_key(inp.cluster, int(inp.cluster.max(initial=0)) + 1)
    seg, ids = repack(inp, docs)
    return OrderingResult(order_frame(ids[np.random.default_rng(inp.seed).permutation(ids.size)]), seg)


SPECS = (
    StrategySpec("cluster_packed", "document", "documents packed cluster by cluster, sequences shuffled (minimum diversity baseline)",
                 seed_free=False, run=run),
)
