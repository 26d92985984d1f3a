"""``duplicate_separated``: Don't Shuffle, Optimize Idea 3 — duplicate-free subsets, each packed on
its own and ordered (by the configured greedy, or by the paper's Idea 2), concatenated."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.ordering.engine import OrderingResult, order_frame
from pipeline.ordering.greedy import greedy_mode
from pipeline.ordering.strategies import StrategySpec
from pipeline.ordering.strategies.greedy import GREEDY, greedy_rows
from pipeline.packing.pack import pack_concat


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


def idea2_params(params):
    """Don't Shuffle, Optimize's Idea 2 as greedy parameters: at each step

        s* = argmin over unscheduled s of sum_i [(T_i + l_{s,i}) - tau_i (S_tot + l_s)]^2,
        tau_i = sum_m l_{s_m,i} / sum_m l_{s_m},

    then T_i += l_{s*,i}, S_tot += l_{s*}: the cluster family alone with variable l_s (objective
    f1), no noise and no batch repair (exact up to ``greedy_exact_max`` sequences, blocked above)."""
    return replace(params, objective="f1", families=(), noise=0.0, greedy_repair=False)


def run(inp):
    """Idea 3: split the documents into duplicate-free, cluster-weight-aware subsets; shuffle each
    subset's documents and pack it on its own (concat; its incomplete last sequence is dropped), so
    no sequence mixes two subsets; order each subset's sequences (``duplicate_order``: ``greedy``,
    the configured objective, or ``idea2``, the paper's Idea 2, :func:`idea2_params`); concatenate
    the subsets in subset order."""
    if inp.content_hash is None:
        raise StrataInputError("duplicate_separated needs a content_hash per document", fix="add a content_hash column to the documents")
    mode = inp.params.duplicate_order
    if mode not in ("greedy", "idea2"):
        raise StrataInputError(f"unknown duplicate_order {mode!r}",
                               fix="set duplicate_order: greedy (the configured objective) or idea2 (the paper's)")
    params = idea2_params(inp.params) if mode == "idea2" else inp.params
    docs = inp.present
    subset = duplicate_subsets(inp.content_hash[docs], inp.cluster[docs], inp.seed)
    shuffle = np.random.default_rng(inp.seed).permutation(docs.size)
    lengths = np.maximum(inp.length, 1)
    frames, parts, modes, offset = [], [], set(), 0
    for k in range(int(subset.max()) + 1 if subset.size else 0):
        packing = pack_concat(docs[shuffle[subset[shuffle] == k]], lengths, inp.seq_len)
        if packing.n_sequences == 0:
            continue
        seg = packing.segments.with_columns(pl.col("sequence_id") + offset)
        f = inp.features(seg)
        parts.append(f.sequence_ids[greedy_rows(f, params, inp.seed)])
        modes.add(greedy_mode(f.n_sequences, params.greedy_exact_max))
        frames.append(seg)
        offset += packing.n_sequences
    if not frames:
        raise StrataInputError("duplicate_separated packed no sequence", fix="give more documents than one sequence's tokens per subset")
    return OrderingResult(order_frame(np.concatenate(parts)), pl.concat(frames), "blocked" if "blocked" in modes else "exact")


SPECS = (
    StrategySpec("duplicate_separated", "document",
                 "Don't Shuffle, Optimize Idea 3: duplicate-free subsets, each packed on its own and greedy-ordered (duplicate_order), "
                 "concatenated",
                 seed_free=False, reads=(*GREEDY, "duplicate_order"), greedy_based=True, run=run, documents=("content_hash",)),
)
