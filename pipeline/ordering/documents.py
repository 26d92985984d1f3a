"""Document-level orderings (Diversity-ordered training; Don't Shuffle, Optimize "Idea 1"): order documents, then pack.

All functions take per-document arrays ``cluster`` (0..K-1) and ``length`` (stream length,
tokens incl. EOS) indexed by doc_id and return a permutation of doc ids.
"""

from __future__ import annotations

import numba
import numpy as np

from pipeline.errors import StrataInputError

from pipeline.names import WITHIN_SORTS  # declared for the config


def cluster_queues(cluster: np.ndarray, length: np.ndarray, within: str) -> tuple[np.ndarray, np.ndarray]:
    """Documents grouped by cluster, each group in the ``within`` order; returns (queue, ptr).

    ``queue[ptr[j]:ptr[j+1]]`` is cluster j's queue. ``length-riffle`` alternates the shortest
    and the longest remaining document (short, long, 2nd short, 2nd long, ...). Ties: doc_id.
    """
    if within not in WITHIN_SORTS:
        raise StrataInputError(f"unknown within-cluster sort {within!r}", fix=f"use one of {', '.join(WITHIN_SORTS)}")
    cluster = np.asarray(cluster, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    ids = np.arange(cluster.size, dtype=np.int64)
    if within == "original":
        queue = np.lexsort((ids, cluster))
    elif within == "length-desc":
        queue = np.lexsort((ids, -length, cluster))
    else:
        queue = np.lexsort((ids, length, cluster))
    k = int(cluster.max()) + 1 if cluster.size else 0
    ptr = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(np.bincount(cluster, minlength=k), out=ptr[1:])
    if within == "length-riffle":
        size = np.diff(ptr)[cluster[queue]]
        rank = np.arange(queue.size) - ptr[cluster[queue]]
        half = (size + 1) // 2
        slot = np.where(rank < half, 2 * rank, 2 * (size - 1 - rank) + 1)
        riffled = np.empty_like(queue)
        riffled[ptr[cluster[queue]] + slot] = queue
        queue = riffled
    return queue, ptr


@numba.njit(cache=True)
def _stratified_counts(ptr, n_docs):
    """Diversity-ordered training's stratified greedy on document counts: O(N K), exact integer deficits.

    deficit_k = r_k / R - p_k / P (remaining share minus picked share); with R, P > 0 common to
    every k the comparison is the integer r_k P - p_k R (before the first pick, P = 0: r_k).
    Only clusters with documents left compete; ties go to the lowest cluster index.
    """
    k = ptr.size - 1
    size = ptr[1:] - ptr[:-1]
    placed = np.zeros(k, dtype=np.int64)
    out = np.empty(n_docs, dtype=np.int64)
    for t in range(n_docs):
        left = n_docs - t  # R
        best = -1
        best_def = 0
        for j in range(k):
            r = size[j] - placed[j]
            if r > 0:
                d = r if t == 0 else r * t - placed[j] * left
                if best < 0 or d > best_def:
                    best = j
                    best_def = d
        out[t] = ptr[best] + placed[best]
        placed[best] += 1
    return out


def stratified_order(cluster: np.ndarray, length: np.ndarray, within: str = "original") -> np.ndarray:
    """Diversity-ordered training: next document from the cluster with the largest deficit (document counts).

    As the paper's reference implementation (``stratified_greedy_order``) computes it, the target
    of cluster k is its share of the documents still *remaining*, so
    deficit_k = remaining_k / remaining_total - picked_k / picked_total (0 before the first
    pick); ties go to the lowest cluster index, and each cluster's documents come in the
    ``within`` order. Exact integer math.
    """
    queue, ptr = cluster_queues(cluster, length, within)
    return queue[_stratified_counts(ptr, queue.size)]


@numba.njit(cache=True)
def _token_weighted(ptr, qlen, total):
    k = ptr.size - 1
    size = ptr[1:] - ptr[:-1]
    tau = np.zeros(k)
    for j in range(k):
        for i in range(ptr[j], ptr[j + 1]):
            tau[j] += qlen[i]
    tau /= total
    placed = np.zeros(k, dtype=np.int64)
    T = np.zeros(k)
    S = 0.0
    n = ptr[-1]
    out = np.empty(n, dtype=np.int64)
    for t in range(n):
        best = -1
        best_v = 0.0
        for j in range(k):
            if placed[j] < size[j]:
                ell = qlen[ptr[j] + placed[j]]
                v = abs((T[j] + ell) - tau[j] * (S + ell))
                if best < 0 or v < best_v:
                    best = j
                    best_v = v
        i = ptr[best] + placed[best]
        out[t] = i
        placed[best] += 1
        T[best] += qlen[i]
        S += qlen[i]
    return out


def token_weighted_order(cluster: np.ndarray, length: np.ndarray, within: str = "original") -> np.ndarray:
    """Don't Shuffle, Optimize Idea 1: d* = argmin |(T_c(d) + l_d) - tau_c(d) (S_tot + l_d)| in token space.

    Candidates are the next document of each cluster's queue (``within`` order), so each step
    costs O(K); ties go to the lowest cluster id.
    """
    queue, ptr = cluster_queues(cluster, length, within)
    qlen = np.asarray(length, dtype=np.float64)[queue]
    return queue[_token_weighted(ptr, qlen, float(qlen.sum()))]


def round_robin_order(cluster: np.ndarray, length: np.ndarray, within: str = "original") -> np.ndarray:
    """Cycle through clusters taking one document each, skipping exhausted ones (Diversity-ordered training)."""
    queue, ptr = cluster_queues(cluster, length, within)
    qc = np.asarray(cluster, dtype=np.int64)[queue]
    rank = np.arange(queue.size) - ptr[qc]
    return queue[np.lexsort((qc, rank))]


@numba.njit(cache=True)
def _worst_fit(order_len, n_bins, capacity):
    """Put each item into the bin with the most remaining room (max-heap; ties: lowest bin)."""
    heap_room = np.full(n_bins, capacity, dtype=np.int64)
    heap_bin = np.arange(n_bins)
    out = np.empty(order_len.size, dtype=np.int64)
    for i in range(order_len.size):
        b = heap_bin[0]
        out[i] = b
        heap_room[0] -= order_len[i]
        # sift down the root
        p = 0
        while True:
            c = 2 * p + 1
            if c >= n_bins:
                break
            if c + 1 < n_bins and (
                heap_room[c + 1] > heap_room[c] or (heap_room[c + 1] == heap_room[c] and heap_bin[c + 1] < heap_bin[c])
            ):
                c += 1
            if heap_room[c] > heap_room[p] or (heap_room[c] == heap_room[p] and heap_bin[c] < heap_bin[p]):
                heap_room[c], heap_room[p] = heap_room[p], heap_room[c]
                heap_bin[c], heap_bin[p] = heap_bin[p], heap_bin[c]
                p = c
            else:
                break
    return out


def bin_packing_order(cluster: np.ndarray, length: np.ndarray, seq_len: int, within: str = "length-desc") -> np.ndarray:
    """Diversity-ordered training's bin-packing: documents dealt into sequence-sized bins, worst fit.

    Diversity-ordered training does not describe its bin packing; we take documents in round-robin cluster order
    (so consecutive documents differ in cluster) and put each into the bin of ``seq_len`` tokens
    with the most room left, n_bins = ceil(total tokens / seq_len); the order is bin by bin.
    """
    rr = round_robin_order(cluster, length, within)
    lens = np.asarray(length, dtype=np.int64)[rr]
    n_bins = max(1, int(-(-int(lens.sum()) // int(seq_len))))
    bins = _worst_fit(lens, n_bins, int(seq_len))
    return rr[np.argsort(bins, kind="stable")]
