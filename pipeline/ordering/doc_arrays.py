"""The per-document arrays every ordering reads (cluster and stream length by doc id), built and
checked in chunks of documents on every core (``run_strategy``'s inputs, 10M documents a run)."""

from __future__ import annotations

import numba
import numpy as np

from pipeline.errors import StrataInputError
from pipeline.segments import even_cuts, n_chunks


def document_arrays(doc_id: np.ndarray, cluster: np.ndarray, n_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(cluster, length)`` indexed by doc id (int64; -1 and 0 where a doc id is absent) of the
    documents ``doc_id`` with their ``cluster`` and ``n_tokens`` (stream length incl. EOS), any
    integer dtypes. Refuses no documents, negative or repeated doc ids, negative clusters and
    empty streams, in that order. Doc ids ascending (a documents table's order) are unique by a
    check in every chunk; others are counted."""
    if doc_id.size == 0:
        raise StrataInputError("there are no documents", fix="give at least one document")
    cuts = even_cuts(doc_id.size, n_chunks(doc_id.size))
    stats = _chunk_stats(doc_id, cluster, n_tokens, cuts)  # per chunk: min id, max id, ascending, min cluster, min n_tokens
    ascending = bool(stats[:, 2].all()) and bool((doc_id[cuts[1:-1]] > doc_id[cuts[1:-1] - 1]).all())
    if stats[:, 0].min() < 0 or (not ascending and np.bincount(doc_id).max() > 1):
        raise StrataInputError("doc_id values are negative or repeated", fix="use unique doc ids 0..N-1")
    if stats[:, 3].min() < 0:
        raise StrataInputError("a cluster id is negative", fix="use cluster ids 0..K-1")
    if stats[:, 4].min() <= 0:
        raise StrataInputError("a document has n_tokens <= 0", fix="n_tokens is the stream length incl. EOS (>= 1)")
    n = int(stats[:, 1].max()) + 1
    by_id, length = np.empty(n, np.int64), np.empty(n, np.int64)
    _fill(by_id, length, even_cuts(n, n_chunks(n)))
    _scatter(doc_id, cluster, n_tokens, cuts, by_id, length)
    return by_id, length


def names_absent(seg_doc: np.ndarray, cluster: np.ndarray) -> bool:
    """Whether a segment's doc id is outside ``cluster`` or absent there (cluster -1)."""
    return bool(seg_doc.size) and bool(_absent(seg_doc, cluster, even_cuts(seg_doc.size, n_chunks(seg_doc.size))))


@numba.njit(cache=True, parallel=True)
def _chunk_stats(doc_id, cluster, n_tokens, cuts):
    out = np.empty((cuts.size - 1, 5), np.int64)
    for c in numba.prange(cuts.size - 1):
        lo, hi = cuts[c], cuts[c + 1]
        low, high, rising, c_min, t_min = doc_id[lo], doc_id[lo], 1, cluster[lo], n_tokens[lo]
        for i in range(lo, hi):
            low, high = min(low, doc_id[i]), max(high, doc_id[i])
            if i > lo and doc_id[i] <= doc_id[i - 1]:
                rising = 0
            c_min, t_min = min(c_min, cluster[i]), min(t_min, n_tokens[i])
        out[c, 0], out[c, 1], out[c, 2], out[c, 3], out[c, 4] = low, high, rising, c_min, t_min
    return out


@numba.njit(cache=True, parallel=True)
def _fill(by_id, length, cuts):
    for c in numba.prange(cuts.size - 1):
        by_id[cuts[c] : cuts[c + 1]] = -1
        length[cuts[c] : cuts[c + 1]] = 0


@numba.njit(cache=True, parallel=True)
def _scatter(doc_id, cluster, n_tokens, cuts, by_id, length):
    for c in numba.prange(cuts.size - 1):  # doc ids are unique: no two chunks write one entry
        for i in range(cuts[c], cuts[c + 1]):
            by_id[doc_id[i]] = cluster[i]
            length[doc_id[i]] = n_tokens[i]


@numba.njit(cache=True, parallel=True)
def _absent(seg_doc, cluster, cuts):
    bad = np.zeros(cuts.size - 1, np.bool_)
    for c in numba.prange(cuts.size - 1):
        for i in range(cuts[c], cuts[c + 1]):
            d = seg_doc[i]
            if d < 0 or d >= cluster.size or cluster[d] < 0:
                bad[c] = True
                break
    return bad.any()
