"""Numba kernels of the ordering diagnostics: one pass over the segments or the sparse composition,
without the per-entry temporaries (keys, sorts, gathers) of the vectorized forms.

At 10M documents a packing has about 11M segments: each NumPy temporary over them is 87 MB, and
the vectorized diagnostics held a dozen at once (2.5 GB). Every kernel here gives exactly what its
vectorized form gave (integer token sums; floating-point sums in the same order), and the callers
in :mod:`pipeline.reports.diagnostics` and :mod:`pipeline.reports.stationarity` keep the
vectorized form for inputs outside the kernels' assumptions (rows not grouped by sequence).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipeline.segments import insert_sorted


def row_pointers(seq: np.ndarray, n_sequences: int) -> np.ndarray:
    """``ptr[s]:ptr[s+1]`` are the rows of sequence s, for rows grouped by ascending sequence id."""
    return np.searchsorted(seq, np.arange(n_sequences + 1, dtype=np.int64))


def composition_of_docs(seq: np.ndarray, doc: np.ndarray, tokens: np.ndarray, doc_group: np.ndarray, n_groups: int) -> tuple:
    """(seq, group, tokens; int32) per distinct (sequence, group) with tokens > 0, sorted
    by both, of segments grouped by ascending sequence id whose group is ``doc_group[doc]``."""
    counts = np.zeros(1, np.int64)
    stamp = np.full(n_groups, -1, np.int64)
    acc = np.zeros(n_groups, np.int64)
    empty = np.empty(0, np.int64)
    _composition(seq, doc, tokens, doc_group, False, counts, empty, empty, empty, stamp, acc)
    # a sequence id, a group id and a sequence's tokens of a group fit 32 bits (12 bytes an entry, not 24)
    out = (np.empty(counts[0], np.int32), np.empty(counts[0], np.int32), np.empty(counts[0], np.int32))
    stamp[:] = -1
    _composition(seq, doc, tokens, doc_group, True, counts, *out, stamp, acc)
    return out


@njit(cache=True)
def _composition(seq, doc, tokens, doc_group, write, counts, out_seq, out_group, out_tokens, stamp, acc) -> None:
    w = 0
    lo = 0
    n = seq.size
    tag = 0
    while lo < n:
        hi = lo + 1
        while hi < n and seq[hi] == seq[lo]:
            hi += 1
        start = w
        for i in range(lo, hi):
            g = doc_group[doc[i]]
            if stamp[g] != tag:
                stamp[g] = tag
                acc[g] = 0
                if write:
                    insert_sorted(out_group, start, w, g)
                w += 1
            acc[g] += tokens[i]
        if write:
            k = start
            for j in range(start, w):  # keep groups with tokens > 0
                g = out_group[j]
                if acc[g] > 0:
                    out_seq[k], out_group[k], out_tokens[k] = seq[lo], g, acc[g]
                    k += 1
            w = k
        else:
            w = start
            for i in range(lo, hi):
                g = doc_group[doc[i]]
                if stamp[g] == tag:
                    stamp[g] = -2 - tag  # count each group once, if its tokens are > 0
                    if acc[g] > 0:
                        w += 1
        tag += 1
        lo = hi
    counts[0] = w


@njit(cache=True)
def batch_deviations(order, ptr, group, tokens, rank, tau_sorted, batch_size, n_batches):
    """max_j |share_j(batch) - tau_j| of each full batch of ``order`` (positions -> sequence), groups
    absent from the batch counting their share: the first absent rank in descending-share order."""
    g_count = tau_sorted.size
    acc = np.zeros(g_count, np.int64)
    stamp = np.full(g_count, -1, np.int64)
    present = np.empty(g_count, np.int64)
    out = np.zeros(n_batches)
    for b in range(n_batches):
        n = 0
        size = 0
        for p in range(b * batch_size, (b + 1) * batch_size):
            s = order[p]
            for k in range(ptr[s], ptr[s + 1]):
                r = rank[group[k]]
                if stamp[r] != b:
                    stamp[r] = b
                    acc[r] = 0
                    present[n] = r
                    n += 1
                acc[r] += tokens[k]
                size += tokens[k]
        worst = 0.0
        total = float(size)
        for j in range(n):
            r = present[j]
            worst = max(worst, abs(acc[r] / total - tau_sorted[r]))
        mex = 0
        while mex < g_count and stamp[mex] == b:
            mex += 1
        out[b] = max(worst, tau_sorted[mex] if mex < g_count else 0.0)
    return out


@njit(cache=True)
def window_unique(order, ptr, group, n_groups, window):
    """Distinct groups in each run of ``window`` consecutive positions (the last may be shorter)."""
    m = order.size
    n_win = -(-m // window)
    stamp = np.full(n_groups, -1, np.int64)
    out = np.zeros(n_win, np.int64)
    for w in range(n_win):
        for p in range(w * window, min(m, (w + 1) * window)):
            s = order[p]
            for k in range(ptr[s], ptr[s + 1]):
                if stamp[group[k]] != w:
                    stamp[group[k]] = w
                    out[w] += 1
    return out


@njit(cache=True)
def prefix_totals(order, ptr, group, tokens, n_groups, cuts):
    """Group tokens after the first ``cuts[i]`` positions (cuts ascending), shape (len(cuts), G)."""
    out = np.zeros((cuts.size, n_groups), np.int64)
    running = np.zeros(n_groups, np.int64)
    p = 0
    for i in range(cuts.size):
        while p < cuts[i]:
            s = order[p]
            for k in range(ptr[s], ptr[s + 1]):
                running[group[k]] += tokens[k]
            p += 1
        out[i] = running
    return out


@njit(cache=True)
def part_sums(part_of_seq, seq, weight, weight2, n_parts):
    """Per part: sum of ``weight`` and of ``weight * weight2`` over rows (part of the row's
    sequence), in row order (``np.bincount``'s order)."""
    num = np.zeros(n_parts)
    den = np.zeros(n_parts)
    for i in range(seq.size):
        q = part_of_seq[seq[i]]
        w = float(weight[i])
        den[q] += w
        num[q] += w * weight2[i]
    return num, den


@njit(cache=True)
def part_group_sums(part_of_seq, seq, group, weight, n_parts, n_groups):
    """(n_parts, G) sums of ``weight`` per (part of the row's sequence, group), in row order."""
    out = np.zeros((n_parts, n_groups))
    for i in range(seq.size):
        out[part_of_seq[seq[i]], group[i]] += weight[i]
    return out
