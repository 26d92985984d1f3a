"""Numba kernels of the ordering diagnostics: one pass over the segments or the sparse composition,
without the per-entry temporaries (keys, sorts, gathers) of the vectorized forms.

At 10M documents a packing has about 11M segments, so each 8-byte NumPy temporary over them is 87
MB, and a vectorized form holds several at once; the kernels hold none. Every kernel here gives
exactly what its vectorized form gave (integer token sums; floating-point sums in the same order),
and the callers in :mod:`pipeline.reports.diagnostics` and :mod:`pipeline.reports.stationarity`
keep the vectorized form for inputs outside the kernels' assumptions (rows not grouped by
sequence).

The large passes run on every core, in chunks, with results that depend neither on the chunks nor
on the thread count: a chunk of sequences or batches writes outputs no other chunk writes, and
floating-point sums keep their sequential order; only integer token sums are split between chunks
and added up, exact in any order and equal to the float64 sums they replace (sums of whole numbers
below 2**53 are exact in float64).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from pipeline.segments import even_cuts, grouped, insert_sorted, n_chunks


def sequence_cuts(seq: np.ndarray, chunks: int) -> np.ndarray:
    """:func:`even_cuts` of rows grouped by ascending sequence id, each cut moved to the first row
    of its sequence, so that every sequence lies in one chunk."""
    cuts = even_cuts(seq.size, chunks)
    if seq.size:
        cuts[1:-1] = np.searchsorted(seq, seq[cuts[1:-1]])
    return cuts


@njit(cache=True)
def row_pointers(seq: np.ndarray, n_sequences: int) -> np.ndarray:
    """``ptr[s]:ptr[s+1]`` are the rows of sequence s, for rows grouped by ascending sequence id
    (what ``searchsorted`` of every id gives, in one counting pass)."""
    ptr = np.zeros(n_sequences + 1, np.int64)
    for s in seq:
        ptr[s + 1] += 1
    for s in range(n_sequences):
        ptr[s + 1] += ptr[s]
    return ptr


def composition_of_docs(seq: np.ndarray, doc: np.ndarray, tokens: np.ndarray, doc_group: np.ndarray, n_groups: int) -> tuple:
    """(seq, group, tokens; int32) per distinct (sequence, group) with tokens > 0, sorted
    by both, of segments grouped by ascending sequence id whose group is ``doc_group[doc]``."""
    return _composition(seq, doc, tokens, doc_group, n_groups, sequence_cuts(seq, n_chunks(seq.size)))


@njit(cache=True, parallel=True)
def _composition(seq, doc, tokens, doc_group, n_groups, cuts):
    """:func:`composition_of_docs` by chunks of sequences (``cuts``): each chunk counts its
    entries, then writes them after the entries of the chunks before it (a sequential pass's output)."""
    chunks = cuts.size - 1
    counts = np.zeros(chunks + 1, np.int64)
    none = np.empty(0, np.int32)
    for c in prange(chunks):
        counts[c + 1] = _composition_rows(seq, doc, tokens, doc_group, n_groups, cuts[c], cuts[c + 1], False, 0, none, none, none)
    starts = np.cumsum(counts)  # starts[c]: the entries of the chunks before chunk c
    # a sequence id, a group id and a sequence's tokens of a group fit 32 bits (12 bytes an entry, not 24)
    n = starts[-1]
    out_seq, out_group, out_tokens = np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int32)
    for c in prange(chunks):
        _composition_rows(seq, doc, tokens, doc_group, n_groups, cuts[c], cuts[c + 1], True, starts[c], out_seq, out_group,
                          out_tokens)
    return out_seq, out_group, out_tokens


@njit(cache=True)
def _composition_rows(seq, doc, tokens, doc_group, n_groups, lo, hi, write, at, out_seq, out_group, out_tokens) -> int:
    """The entries of the sequences in rows ``lo:hi``: counted, or also written from ``at`` when
    ``write``; returns how many. A sequence's groups with tokens > 0 are inserted in ascending
    order as they come, so nothing is written past the sequence's own entries."""
    stamp = np.full(n_groups, -1, np.int64)
    acc = np.zeros(n_groups, np.int64)
    w = at
    tag = 0
    while lo < hi:
        end = lo + 1
        while end < hi and seq[end] == seq[lo]:
            end += 1
        for i in range(lo, end):
            g = doc_group[doc[i]]
            if stamp[g] != tag:
                stamp[g] = tag
                acc[g] = 0
            acc[g] += tokens[i]
        start = w
        for i in range(lo, end):
            g = doc_group[doc[i]]
            if stamp[g] == tag:
                stamp[g] = -2 - tag  # each group once, if its tokens are > 0
                if acc[g] > 0:
                    if write:
                        insert_sorted(out_group, start, w, g)
                    w += 1
        if write:
            for j in range(start, w):
                out_seq[j], out_tokens[j] = seq[lo], acc[out_group[j]]
        tag += 1
        lo = end
    return w - at


def batch_deviations(order, ptr, group, tokens, rank, tau_sorted, batch_size: int, n_batches: int) -> np.ndarray:
    """max_j |share_j(batch) - tau_j| of each full batch of ``order`` (positions -> sequence), groups
    absent from the batch counting their share: the first absent rank in descending-share order."""
    return _batch_deviations(order, ptr, group, tokens, rank, tau_sorted, batch_size, even_cuts(n_batches, n_chunks(group.size)))


@njit(cache=True, parallel=True)
def _batch_deviations(order, ptr, group, tokens, rank, tau_sorted, batch_size, cuts):
    """:func:`batch_deviations` by chunks of batches (``cuts``), each with its own scratch arrays."""
    g_count = tau_sorted.size
    out = np.zeros(cuts[-1])
    for c in prange(cuts.size - 1):
        acc = np.zeros(g_count, np.int64)
        stamp = np.full(g_count, -1, np.int64)
        present = np.empty(g_count, np.int64)
        for b in range(cuts[c], cuts[c + 1]):
            out[b] = _batch_deviation(order, ptr, group, tokens, rank, tau_sorted, batch_size, b, acc, stamp, present)
    return out


@njit(cache=True)
def _batch_deviation(order, ptr, group, tokens, rank, tau_sorted, batch_size, b, acc, stamp, present) -> float:
    """Batch b's deviation; ``stamp[r] == b`` marks the ranks present in it (stamps of earlier batches are < b)."""
    g_count = tau_sorted.size
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
    return max(worst, tau_sorted[mex] if mex < g_count else 0.0)


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


def prefix_totals(order, ptr, group, tokens, n_groups: int, cuts: np.ndarray) -> np.ndarray:
    """Group tokens after the first ``cuts[i]`` positions (cuts ascending), shape (len(cuts), G)."""
    last = int(cuts[-1]) if cuts.size else 0
    bounds = even_cuts(last, n_chunks(group.size * last // max(order.size, 1)))  # about equal entries a chunk
    return _prefix_totals(order, ptr, group, tokens, n_groups, cuts, bounds, np.searchsorted(cuts, bounds, side="right"))


@njit(cache=True, parallel=True)
def _prefix_totals(order, ptr, group, tokens, n_groups, cuts, bounds, cut_at):
    """:func:`prefix_totals` by chunks of positions ``bounds[c]:bounds[c+1]``, holding the cuts
    ``cut_at[c]:cut_at[c+1]``: each chunk sums its own tokens, then each cut adds the chunks before
    its own (integers: the same totals as one running sum)."""
    chunks = bounds.size - 1
    out = np.zeros((cuts.size, n_groups), np.int64)
    part = np.zeros((chunks, n_groups), np.int64)
    for c in prange(chunks):
        running, i, seqs = part[c], cut_at[c], order[bounds[c] : bounds[c + 1]]
        for p in range(seqs.size):
            s = seqs[p]
            for k in range(ptr[s], ptr[s + 1]):
                running[group[k]] += tokens[k]
            while i < cut_at[c + 1] and cuts[i] == bounds[c] + p + 1:
                out[i] = running
                i += 1
    before = np.zeros(n_groups, np.int64)
    for c in range(chunks):
        for i in range(cut_at[c], cut_at[c + 1]):
            out[i] += before
        before += part[c]
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


def part_group_tokens(part_of_seq, seq, group, tokens, n_parts: int, n_groups: int) -> np.ndarray:
    """(n_parts, G) token sums (int64) per (part of the row's sequence, group)."""
    return _part_group_tokens(part_of_seq, seq, group, tokens, n_parts, n_groups, even_cuts(seq.size, n_chunks(seq.size)))


@njit(cache=True, parallel=True)
def _part_group_tokens(part_of_seq, seq, group, tokens, n_parts, n_groups, cuts):
    """:func:`part_group_tokens` by chunks of rows (``cuts``), each into its own sums (integers:
    added up in any order, the same totals)."""
    part = np.zeros((cuts.size - 1, n_parts, n_groups), np.int64)
    for c in prange(cuts.size - 1):
        sums, lo, hi = part[c], cuts[c], cuts[c + 1]
        rows_seq, rows_group, rows_tokens = seq[lo:hi], group[lo:hi], tokens[lo:hi]  # from index 0: no negative-index checks
        for i in range(rows_seq.size):
            sums[part_of_seq[rows_seq[i]], rows_group[i]] += rows_tokens[i]
    return part.sum(axis=0)


@njit(cache=True, parallel=True)
def part_feature_sums(part_of_seq, features, n_parts):
    """(n_parts, F) sums of each row of ``features`` (F, M) over the sequences of each part, in
    sequence order (``np.bincount``'s): one feature a task, each summed as alone."""
    out = np.zeros((features.shape[0], n_parts))
    for f in prange(features.shape[0]):
        sums, row = np.zeros(n_parts), features[f]  # sums: a task's own, no cache line shared with another task's
        for s in range(row.size):
            sums[part_of_seq[s]] += row[s]
        out[f] = sums
    return out.T


def group_tokens(group, tokens, n_groups: int) -> np.ndarray:
    """Token sums (int64) per group."""
    return _group_tokens(group, tokens, n_groups, even_cuts(group.size, n_chunks(group.size)))


@njit(cache=True, parallel=True)
def _group_tokens(group, tokens, n_groups, cuts):
    """:func:`group_tokens` by chunks of rows (``cuts``), each into its own sums (integers)."""
    part = np.zeros((cuts.size - 1, n_groups), np.int64)
    for c in prange(cuts.size - 1):
        sums, lo, hi = part[c], cuts[c], cuts[c + 1]
        rows_group, rows_tokens = group[lo:hi], tokens[lo:hi]
        for i in range(rows_group.size):
            sums[rows_group[i]] += rows_tokens[i]
    return part.sum(axis=0)


def square_sums(seq, tokens, n_sequences: int) -> np.ndarray:
    """Sum of tokens**2 (float64) per sequence id, for rows grouped by ascending sequence id."""
    return _square_sums(seq, tokens, n_sequences, sequence_cuts(seq, n_chunks(seq.size)))


@njit(cache=True, parallel=True)
def _square_sums(seq, tokens, n_sequences, cuts):
    """:func:`square_sums` by chunks of whole sequences (``cuts``): each sequence summed by one
    task in row order (``np.bincount``'s)."""
    out = np.zeros(n_sequences)
    for c in prange(cuts.size - 1):
        lo, hi = cuts[c], cuts[c + 1]
        rows_seq, rows_tokens = seq[lo:hi], tokens[lo:hi]
        for i in range(rows_seq.size):
            t = float(rows_tokens[i])
            out[rows_seq[i]] += t * t
    return out


def token_sums(seq: np.ndarray, tokens: np.ndarray, n_sequences: int, per_token: np.ndarray | None = None) -> tuple:
    """Per sequence id: the sum of ``tokens`` and, with ``per_token``, of ``tokens * per_token``
    over its rows (int64; ``np.bincount``'s float sums of these whole numbers have the same
    values). Rows grouped by ascending sequence id are summed in chunks of whole sequences on
    every core without a per-row temporary; others by ``np.bincount``."""
    if not grouped(seq):
        tok = tokens.astype(np.float64)
        return (np.bincount(seq, weights=tok, minlength=n_sequences),
                None if per_token is None else np.bincount(seq, weights=tok * per_token, minlength=n_sequences))
    weighted = per_token is not None
    length, product = _token_sums(seq, tokens, per_token if weighted else tokens[:0], weighted, n_sequences,
                                  sequence_cuts(seq, n_chunks(seq.size)))
    return length, (product if weighted else None)


@njit(cache=True, parallel=True)
def _token_sums(seq, tokens, per_token, weighted, n_sequences, cuts):
    """:func:`token_sums` by chunks of whole sequences (``cuts``): no two chunks write one sum."""
    length = np.zeros(n_sequences, np.int64)
    product = np.zeros(n_sequences if weighted else 0, np.int64)
    for c in prange(cuts.size - 1):
        for i in range(cuts[c], cuts[c + 1]):
            length[seq[i]] += tokens[i]
            if weighted:
                product[seq[i]] += np.int64(tokens[i]) * np.int64(per_token[i])
    return length, product


def batch_entries(order, ptr, group, tokens, n_groups: int, batch: int, n_batches: int) -> tuple:
    """Each full batch's token sums per group, sparse: ``(bptr, bgroup, btokens)`` with the entries
    of batch b (positions ``b*batch .. (b+1)*batch - 1`` of ``order``) at ``bptr[b]:bptr[b+1]``,
    one per group with tokens in it, in the order the batch first meets them; ``bgroup`` int32,
    ``btokens`` int64. At most as many entries as the composition, never a batches x groups matrix."""
    return _batch_entries(order, ptr, group, tokens, n_groups, batch, even_cuts(n_batches, n_chunks(group.size)))


@njit(cache=True, parallel=True)
def _batch_entries(order, ptr, group, tokens, n_groups, batch, cuts):
    """:func:`batch_entries` by chunks of batches (``cuts``): each chunk counts its batches'
    entries, then writes them at their offsets (a sequential pass's output)."""
    chunks = cuts.size - 1
    counts = np.zeros(cuts[-1] + 1, np.int64)
    for c in prange(chunks):
        stamp = np.full(n_groups, -1, np.int64)
        for b in range(cuts[c], cuts[c + 1]):
            n = 0
            for p in range(b * batch, (b + 1) * batch):
                s = order[p]
                for k in range(ptr[s], ptr[s + 1]):
                    if stamp[group[k]] != b:
                        stamp[group[k]] = b
                        n += 1
            counts[b + 1] = n
    bptr = np.cumsum(counts)
    bgroup = np.empty(bptr[-1], np.int32)
    btokens = np.zeros(bptr[-1], np.int64)
    for c in prange(chunks):
        stamp = np.full(n_groups, -1, np.int64)
        slot = np.empty(n_groups, np.int64)
        for b in range(cuts[c], cuts[c + 1]):
            w = bptr[b]
            for p in range(b * batch, (b + 1) * batch):
                s = order[p]
                for k in range(ptr[s], ptr[s + 1]):
                    g = group[k]
                    if stamp[g] != b:
                        stamp[g] = b
                        slot[g] = w
                        bgroup[w] = g
                        w += 1
                    btokens[slot[g]] += tokens[k]
    return bptr, bgroup, btokens


SLACK = 1e-12  # a window is skipped when its bound is below the best by more than rounding (values lie in [0, 1])


@njit(cache=True, parallel=True)
def worst_windows(bptr, bgroup, btokens, tau, rank, tau_sorted, spans):
    """For each window length ``spans[i]`` (in batches): the largest ``max_j |share_j - tau_j|`` over
    the windows of that many consecutive batches starting at every batch, and the first batch of
    the first window that reaches it.

    One task per length slides its window a batch at a time, keeping the window's tokens per group
    (``acc``, a dense vector) by adding the batch that enters and subtracting the batch that
    leaves. A window's deviation (:func:`_window_deviation`) is the value :func:`batch_deviations`
    gives a batch, bit for bit. It is computed only when an upper bound does not rule the window
    out: each group's current count was set at some earlier window of ``T0`` tokens, where its
    deviation ``v`` and share ``s = acc_j / T0`` were known; at ``T`` tokens its deviation is at
    most ``v + s |T0 / T - 1|``. So the running maxima V of those deviations and S of those shares
    (since the last computed window, over it and the groups changed since), with the range of
    ``T0`` met, bound every group; a window whose bound is below the length's best so far cannot
    be the worst, and costs only its two changed batches."""
    n_groups = tau.size
    n_batches = bptr.size - 1
    worst = np.zeros(spans.size)
    first = np.zeros(spans.size, np.int64)
    for i in prange(spans.size):
        span = spans[i]
        acc = np.zeros(n_groups, np.int64)
        stamp = np.full(n_groups, -1, np.int64)
        total = 0
        for e in range(bptr[0], bptr[span]):
            acc[bgroup[e]] += btokens[e]
            total += btokens[e]
        best, best_at = -1.0, 0
        v_max, s_max, t_lo, t_hi = 0.0, 0.0, 0.0, 0.0
        for a in range(n_batches - span + 1):
            if a > 0:
                for e in range(bptr[a - 1], bptr[a]):
                    acc[bgroup[e]] -= btokens[e]
                    total -= btokens[e]
                for e in range(bptr[a + span - 1], bptr[a + span]):
                    acc[bgroup[e]] += btokens[e]
                    total += btokens[e]
                size = float(total)
                t_lo, t_hi = min(t_lo, size), max(t_hi, size)
                for lo, hi in ((bptr[a - 1], bptr[a]), (bptr[a + span - 1], bptr[a + span])):
                    for e in range(lo, hi):
                        g = bgroup[e]
                        share = acc[g] / size
                        v_max = max(v_max, abs(share - tau[g]))
                        s_max = max(s_max, share)
                drift = max(t_hi / size - 1.0, 1.0 - t_lo / size, 0.0)
                if v_max + s_max * drift + SLACK < best:
                    continue
            size = float(total)
            dev, s_max = _window_deviation(acc, size, bptr[a], bptr[a + span], bgroup, tau, rank, tau_sorted, stamp, a)
            v_max, t_lo, t_hi = dev, size, size
            if dev > best:
                best, best_at = dev, a
        worst[i] = best
        first[i] = best_at
    return worst, first


@njit(cache=True)
def _window_deviation(acc, size, lo, hi, bgroup, tau, rank, tau_sorted, stamp, tag):
    """(max_j |acc_j / size - tau_j|, max_j acc_j / size) of a window whose batch entries are
    ``lo:hi``: over those entries when they are fewer than the groups (``stamp[r] == tag`` marks
    the ranks present; an absent group deviates by its share, the first absent rank's), else over
    every group of ``acc``."""
    n_groups = tau.size
    dev, top = 0.0, 0.0
    if hi - lo < n_groups:
        for e in range(lo, hi):
            g = bgroup[e]
            r = rank[g]
            if stamp[r] != tag:
                stamp[r] = tag
                share = acc[g] / size
                dev = max(dev, abs(share - tau[g]))
                top = max(top, share)
        mex = 0
        while mex < n_groups and stamp[mex] == tag:
            mex += 1
        if mex < n_groups:
            dev = max(dev, tau_sorted[mex])
    else:
        for j in range(n_groups):
            share = acc[j] / size
            dev = max(dev, abs(share - tau[j]))
            top = max(top, share)
    return dev, top
