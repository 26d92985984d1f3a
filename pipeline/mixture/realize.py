"""Realizing a mixture with a finite corpus: which sequences a run trains on, and in what order.

A learned mixture p differs from the corpus shares, so a fixed budget of M = max_steps x
batch_size sequences cannot be met by one pass over the corpus. We define it this way:

1. **Pool.** The training documents are packed cluster by cluster (:func:`cluster_pure_segments`):
   each cluster's documents, in a seeded order, are concatenated and cut every L tokens; the
   cluster's last sequence keeps its tail (padded), so every sequence holds exactly one cluster
   and no token is dropped. Cluster j has m_j sequences.
2. **Allocation** (:func:`allocate`). n_j = p_j M sequences, rounded by largest remainder, with a
   repetition cap n_j <= floor(max_cluster_epochs * m_j). Budget a capped cluster cannot absorb is
   handed to the uncapped clusters in proportion to p (water-filling), so sum_j n_j = M whenever
   floor(max_cluster_epochs * m_j) summed over clusters is >= M; otherwise it is an error (raise
   ``mixture.max_cluster_epochs`` or lower the budget).
3. **Selection** (:func:`realize`). Cluster j's n_j sequences are floor(n_j / m_j) full passes
   over its sequences plus a seeded subsample (without replacement) of the remainder, so no
   sequence is used twice before every sequence of its cluster is used once.
4. **Order.** The multiset is ordered by the greedy (static mixture) or by the curriculum greedy
   (learned f), which then track the realized shares / E_j(S) (TerRIFIC curricula,
   "Curriculum-Aligned Scheduling"); copies of a sequence are separate candidates.

Tokens are counted in sequences: every pool sequence is L tokens except each cluster's last, so
sequence shares equal token shares up to one tail per cluster. The repetition this causes is
reported per cluster (copies, epochs = n_j / m_j) and as ``repeated_fraction``: the share of the
M selected sequences that are second or later copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.ordering.features import Csr, SequenceFeatures, sequence_features
from pipeline.packing.pack import SEGMENT_SCHEMA


def cluster_pure_segments(doc_ids: np.ndarray, doc_cluster: np.ndarray, stream_lengths: np.ndarray, seq_len: int,
                          seed: int) -> tuple[pl.DataFrame, np.ndarray]:
    """Pack documents cluster by cluster (seeded order within a cluster); ``(segments, cluster of each sequence)``.

    ``doc_ids``/``doc_cluster``/``stream_lengths`` are aligned per document (length incl. EOS).
    Every cluster starts a new sequence; its last sequence may be shorter than ``seq_len``.
    """
    doc_ids = np.asarray(doc_ids, dtype=np.int64)
    cl = np.asarray(doc_cluster, dtype=np.int64)
    n = np.asarray(stream_lengths, dtype=np.int64)
    if doc_ids.size == 0 or n.min() <= 0 or cl.min() < 0:
        raise StrataInputError("cannot pack: no documents, a non-positive length or a negative cluster",
                               fix="pass documents with clusters 0..K-1 and lengths >= 1")
    L = int(seq_len)
    order = np.lexsort((np.random.default_rng(seed).permutation(doc_ids.size), cl))
    d, c, ln = doc_ids[order], cl[order], n[order]
    k = int(c.max()) + 1
    tot = np.bincount(c, weights=ln, minlength=k).astype(np.int64)
    n_seq = -(-tot // L)
    base = (np.cumsum(n_seq) - n_seq) * L  # global token position where each cluster starts
    local = np.cumsum(ln) - ln - (np.cumsum(tot) - tot)[c]
    start = base[c] + local
    end = start + ln
    first, last = start // L, (end - 1) // L
    pieces = last - first + 1
    doc_rep = np.repeat(np.arange(d.size), pieces)
    k_in = np.arange(pieces.sum()) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    seq = first[doc_rep] + k_in
    lo = np.maximum(start[doc_rep], seq * L)
    hi = np.minimum(end[doc_rep], (seq + 1) * L)
    segments = pl.DataFrame(
        {"sequence_id": seq, "seq_token_start": (lo - seq * L).astype(np.int32), "doc_id": d[doc_rep],
         "doc_token_start": lo - start[doc_rep], "n_tokens": (hi - lo).astype(np.int32)},
        schema=SEGMENT_SCHEMA,
    )
    seq_cluster = np.repeat(np.arange(k), n_seq)
    return segments, seq_cluster


def allocate(weights: np.ndarray, supply: np.ndarray, total: int, max_cluster_epochs: float) -> np.ndarray:
    """Sequences per cluster: n_j ~ p_j * total, capped at floor(max_cluster_epochs * m_j), summing to ``total``."""
    p = np.asarray(weights, dtype=np.float64)
    m = np.asarray(supply, dtype=np.int64)
    if p.shape != m.shape or p.min() < 0 or not p.sum() > 0:
        raise StrataInputError("mixture weights must be nonnegative, one per cluster, not all zero", fix="pass softmax(logits)")
    cap = np.floor(max_cluster_epochs * m + 1e-9).astype(np.int64)
    cap[p <= 0] = 0
    if cap.sum() < total:
        raise StrataInputError(
            f"the corpus cannot give {total} sequences under mixture.max_cluster_epochs={max_cluster_epochs} (at most {int(cap.sum())})",
            fix="raise mixture.max_cluster_epochs, or lower max_steps x batch_size",
        )
    n = np.zeros_like(m)
    free = cap > 0
    left = int(total)
    while left > 0:
        q = np.where(free, p, 0.0)
        if not q.sum() > 0:  # only clusters of weight 0 remain uncapped: cannot happen (cap 0 there)
            break
        want = q / q.sum() * left
        room = cap - n
        over = free & (want >= room)
        if over.any():  # water-filling: saturate capped clusters, redistribute the rest
            n[over] = cap[over]
            free &= ~over
            left = int(total - n.sum())
            continue
        base = np.floor(want).astype(np.int64)
        rem = left - int(base.sum())
        frac = np.where(free, want - base, -1.0)
        top = np.lexsort((np.arange(p.size), -frac))[:rem]
        base[top] += 1
        n += base
        left = 0
    return n


@dataclass(frozen=True)
class Realization:
    sequence_ids: np.ndarray  # (M,) pool sequence ids, with repeats, grouped by cluster
    table: pl.DataFrame  # cluster, weight, supply, selected, share, epochs, max_copies

    @property
    def repeated_fraction(self) -> float:
        ids = self.sequence_ids
        return float(1.0 - np.unique(ids).size / ids.size) if ids.size else 0.0


def realize(seq_cluster: np.ndarray, weights: np.ndarray, total: int, max_cluster_epochs: float, seed: int) -> Realization:
    """Select ``total`` pool sequences following ``weights`` (see module doc, steps 2-3)."""
    seq_cluster = np.asarray(seq_cluster, dtype=np.int64)
    k = np.asarray(weights).size
    if seq_cluster.size and seq_cluster.max() >= k:
        raise StrataInputError(f"the pool has cluster {int(seq_cluster.max())} but the mixture {k} weights",
                               fix="learn the mixture on the same clusters")
    supply = np.bincount(seq_cluster, minlength=k)
    n = allocate(weights, supply, total, max_cluster_epochs)
    rng = np.random.default_rng(seed)
    parts, copies = [], np.zeros(k, dtype=np.int64)
    for j in np.flatnonzero(n):
        members = np.flatnonzero(seq_cluster == j)
        full, rest = divmod(int(n[j]), members.size)
        parts.append(np.concatenate([np.tile(members, full), rng.permutation(members)[:rest]]))
        copies[j] = full + (1 if rest else 0)
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    table = pl.DataFrame({
        "cluster": np.arange(k, dtype=np.int64), "weight": np.asarray(weights, dtype=np.float64),
        "supply": supply.astype(np.int64), "selected": n.astype(np.int64), "share": n / max(total, 1),
        "epochs": n / np.maximum(supply, 1), "max_copies": copies,
    })
    return Realization(ids.astype(np.int64), table)


def multiset_features(pool_segments: pl.DataFrame, doc_cluster: np.ndarray, doc_length: np.ndarray, sequence_ids: np.ndarray,
                      n_clusters: int, length_bins: int) -> SequenceFeatures:
    """Features of a multiset of pool sequences: row r is copy ``sequence_ids[r]`` (copies are separate rows).

    ``doc_cluster``/``doc_length`` are indexed by doc_id; the cluster matrix always has
    ``n_clusters`` columns (clusters without selected sequences included).
    """
    seg = pool_segments.sort("sequence_id", "seq_token_start")
    sid = seg["sequence_id"].to_numpy()
    ptr = np.searchsorted(sid, np.arange(int(sid.max()) + 2))
    ids = np.asarray(sequence_ids, dtype=np.int64)
    lo, hi = ptr[ids], ptr[ids + 1]
    cnt = hi - lo
    sel = np.repeat(lo, cnt) + np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    row = np.repeat(np.arange(ids.size), cnt)
    d = seg["doc_id"].to_numpy()[sel]
    f = sequence_features(row, doc_cluster[d], doc_length[d], seg["n_tokens"].to_numpy()[sel], length_bins, d)
    k = f.clusters.n_cols
    if k < n_clusters:
        joint = np.vstack([f.cluster_bin_tokens, np.zeros((n_clusters - k, f.cluster_bin_tokens.shape[1]))])
        f = SequenceFeatures(f.sequence_ids, Csr(f.clusters.indptr, f.clusters.indices, f.clusters.data, n_clusters), f.bins, f.lengths,
                             f.bin_edges, joint)
    return f
