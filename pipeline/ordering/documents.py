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
def _alive(link, i):
    """The representative of ``i`` in a path-compressed "next alive" forest (``link[i] == i``: alive)."""
    r = i
    while link[r] != r:
        r = link[r]
    while link[i] != r:
        nxt = link[i]
        link[i] = r
        i = nxt
    return r


@numba.njit(cache=True)
def _lower_bound(a, lo, hi, x):
    """First index in ``a[lo:hi]`` (sorted) whose value is >= x; ``hi`` when none."""
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True)
def _token_weighted(ptr, slen, total):
    """Idea 1's argmin over every remaining document; ``slen[ptr[j]:ptr[j+1]]`` is cluster j's
    lengths, ascending (ties in the ``within`` order). Returns positions into that layout.

    Within cluster j the score |(T_j + l) - tau_j (S + l)| = |a_j + b_j l| (a_j = T_j - tau_j S,
    b_j = 1 - tau_j >= 0) is V-shaped in l with its minimum at l* = -a_j / b_j, so the cluster's
    best remaining document is one of the two remaining lengths around l*: a binary search and
    two "next alive" look-ups, O(K log n) per step. Ties: the lowest cluster, then the shorter
    document, then the earlier one in the ``within`` order.
    """
    k = ptr.size - 1
    n = ptr[-1]
    tau = np.zeros(k)
    for j in range(k):
        for i in range(ptr[j], ptr[j + 1]):
            tau[j] += slen[i]
    tau /= total
    right = np.arange(n + 1)  # right[i] == i: position i is alive (n: the sentinel)
    left = np.arange(n + 1)  # left[i + 1] == i + 1: position i is alive (0: the sentinel)
    placed = np.zeros(k, dtype=np.int64)
    T = np.zeros(k)
    S = 0.0
    out = np.empty(n, dtype=np.int64)
    for t in range(n):
        best = -1
        best_j = 0
        best_v = 0.0
        for j in range(k):
            lo, hi = ptr[j], ptr[j + 1]
            if placed[j] == hi - lo:
                continue
            b = 1.0 - tau[j]
            if b <= 0.0:  # the only cluster: every document scores the same, take the shortest
                cand = _alive(right, lo)
            else:
                x = -(T[j] - tau[j] * S) / b
                p = _lower_bound(slen, lo, hi, x)
                r = _alive(right, p)
                q = _alive(left, p) - 1  # the last alive position < p (left is shifted by one)
                cand = -1
                if q >= lo:  # the earliest alive document of that length
                    cand = _alive(right, _lower_bound(slen, lo, hi, slen[q]))
                if r < hi:
                    if cand < 0:
                        cand = r
                    else:
                        vq = abs((T[j] + slen[cand]) - tau[j] * (S + slen[cand]))
                        vr = abs((T[j] + slen[r]) - tau[j] * (S + slen[r]))
                        if vr < vq:
                            cand = r
            ell = slen[cand]
            v = abs((T[j] + ell) - tau[j] * (S + ell))
            if best < 0 or v < best_v:
                best = cand
                best_v = v
                best_j = j
        out[t] = best
        right[best] = best + 1
        left[best + 1] = best
        placed[best_j] += 1
        T[best_j] += slen[best]
        S += slen[best]
    return out


def token_weighted_order(cluster: np.ndarray, length: np.ndarray, within: str = "original") -> np.ndarray:
    """Don't Shuffle, Optimize Idea 1, as the paper writes it: at every step the next document is

        d* = argmin over all remaining d of |(T_c(d) + l_d) - tau_c(d) (S_tot + l_d)|,
        tau_i = sum_{d in c_i} l_d / L_tot,

    then T_c(d*) += l_d*, S_tot += l_d* (token space: l_d is the stream length, EOS included).
    A true argmin over every remaining document, in O(K log n) a step (sorted lengths per
    cluster, see ``_token_weighted``). Ties: the lowest cluster id, then the shorter document,
    then the earlier one in the ``within`` order (``original``: doc id), the only use of ``within``.
    """
    queue, ptr = cluster_queues(cluster, length, within)
    qlen = np.asarray(length, dtype=np.int64)[queue]
    qc = np.asarray(cluster, dtype=np.int64)[queue]
    srt = np.lexsort((np.arange(queue.size), qlen, qc))  # per cluster by length, ties in the within order
    if queue.size == 0:
        return queue
    return queue[srt][_token_weighted(ptr, qlen[srt].astype(np.float64), float(qlen.sum()))]


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
