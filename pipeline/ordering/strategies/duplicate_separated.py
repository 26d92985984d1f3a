"""``duplicate_separated``: Don't Shuffle, Optimize Idea 3 — duplicate-free subsets, each packed
and greedy-ordered, concatenated."""

from __future__ import annotations

import numpy as np

from pipeline.errors import StrataInputError
from pipeline.ordering.strategies import StrategySpec
from pipeline.ordering.strategies.greedy import GREEDY, greedy_rows


def duplicate_subsets(content_hash: np.ndarray, cluster: np.ndarray, seed: int) -> np.ndarray:
    """Split documents into max-multiplicity subsets, each duplicate-free.

    The k-th of m copies goes to subset floor(k * n_sub / m) (copies spread evenly, never two in
    one subset); unique documents are dealt across subsets cluster by cluster in a seeded order,
    so each subset keeps the global cluster weights ("cluster weight aware subsets").
    """
    n = content_hash.size
    _, inv, counts = np.unique(content_hash, return_inverse=True, return_counts=True)
    n_sub = int(counts.max()) if n else 1
    mult = counts[inv]
    order = np.lexsort((np.arange(n), inv))
    occ = np.empty(n, dtype=np.int64)
    occ[order] = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)
    subset = (occ * n_sub) // mult
    uniq = np.flatnonzero(mult == 1)
    if uniq.size:
        rnd = np.random.default_rng(seed).permutation(uniq.size)
        by = np.lexsort((rnd, cluster[uniq]))
        subset[uniq[by]] = np.arange(uniq.size) % n_sub
    return subset


def run(inp):
    import polars as pl

    from pipeline.ordering.engine import OrderingResult, order_frame, repack
    from pipeline.ordering.greedy import greedy_mode

    if inp.content_hash is None:
        raise StrataInputError("duplicate_separated needs a content_hash per document", fix="add a content_hash column to the documents")
    docs = inp.present
    subset = duplicate_subsets(inp.content_hash[docs], inp.cluster[docs], inp.seed)
    shuffle = np.random.default_rng(inp.seed).permutation(docs.size)
    doc_order = docs[shuffle[np.argsort(subset[shuffle], kind="stable")]]
    seg, _ = repack(inp, doc_order)
    first = seg.group_by("sequence_id").agg(pl.col("doc_id").first()).sort("sequence_id")
    sub_of_doc = np.full(inp.cluster.size, -1, dtype=np.int64)
    sub_of_doc[docs] = subset
    seq_sub = sub_of_doc[first["doc_id"].to_numpy()]
    seq_ids = first["sequence_id"].to_numpy()
    parts, modes = [], set()
    for k in np.unique(seq_sub):
        ids = seq_ids[seq_sub == k]
        f = inp.features(seg.filter(pl.col("sequence_id").is_in(ids.tolist())))
        parts.append(f.sequence_ids[greedy_rows(f, inp.params, inp.seed)])
        modes.add(greedy_mode(f.n_sequences, inp.params.greedy_exact_max))
    return OrderingResult(order_frame(np.concatenate(parts)), seg, "blocked" if "blocked" in modes else "exact")


SPECS = (
    StrategySpec("duplicate_separated", "document", "Don't Shuffle, Optimize Idea 3: duplicate-free subsets, each greedy-ordered, concatenated",
                 seed_free=False, reads=GREEDY, greedy_based=True, run=run, documents=("content_hash",)),
)
