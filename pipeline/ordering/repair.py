"""Swap repair of a schedule's worst training batches (the greedy strategy's last step).

The measure is Don't Shuffle, Optimize's objective restricted to the training batches, as the
diagnostics compute it (``pipeline.reports.diagnostics.batch_deviations``): for each full batch
of ``batch_size`` consecutive sequences, dev = max over groups of |share in the batch - global share|
(groups absent from the batch deviate by their global share); a batch's score here is the largest
of its repaired families' devs: the token families of ``pipeline/ordering/families/`` that set
``repaired`` (built in: clusters and length bins).

The worst ``fraction`` of the batches (at least one), worst first, each get the single swap of one
of their sequences with one sequence of a batch at most ``reach`` batches away that lowers the
larger of the two batches' scores the most, if any does; this is repeated ``passes`` times, each
pass on the batches then worst (a batch one swap could not fix, e.g. in a run of bad batches at the
end of a blocked greedy's block, gets another swap once its neighbours have improved). Nothing else
moves, so the mean deviation barely changes; the swaps target the rare batch where the greedy had to
place two sequences of one group close together (e.g. two whole sequences of a long-document length
bin in one batch). At M = 1M (K = 1000, L = 2048, blocked greedy, objective stationary) the worst
batch's deviation (clusters / bins) is 0.049 / 0.053 unrepaired, 0.040 / 0.041 after one pass over
the worst 10% and 0.031 / 0.031 after 4 passes over the worst 2%, the defaults.

A candidate swap is scored without summing the swapped batches from their rows: each batch without
its i-th row is summed once, each candidate row is added and taken away again, and a swap is
dropped at its first term past the batch's deviation (it cannot win). The sums are whole token
counts, exact in any order, so these are the swaps, in the order, that summing the rows gives.
The batches to repair are scored in waves of batches far enough apart that no swap of one touches
another's candidates, one parallel pass a wave rather than one a batch, because each parallel pass
wakes the thread pool, whose idle threads sleep in the assets (``OMP_WAIT_POLICY=PASSIVE``).
"""

from __future__ import annotations

from typing import Sequence

import numba
import numpy as np

from pipeline.ordering.families import TokenFamily
from pipeline.ordering.families import repaired as registered_repaired
from pipeline.ordering.features import Csr, SequenceFeatures

REPAIR_FRACTION = 0.02  # share of the batches repaired per pass (the worst ones)
REPAIR_PASSES = 4
REPAIR_REACH = 2  # partner batches at most this many batches away
WAVE = 64  # batches scored in one parallel pass at most (their windows disjoint)


@numba.njit(cache=True)
def _group_dev(rows, ptr, ind, dat, lengths, share, by_share, buf, stamp, tag):
    """max_g |tokens_g(rows) / tokens(rows) - share_g|, absent groups counting share_g."""
    total = 0.0
    for r in rows:
        total += lengths[r]
        for k in range(ptr[r], ptr[r + 1]):
            g = ind[k]
            if stamp[g] != tag:
                stamp[g] = tag
                buf[g] = 0.0
            buf[g] += dat[k]
    worst = 0.0
    for r in rows:
        for k in range(ptr[r], ptr[r + 1]):
            worst = max(worst, abs(buf[ind[k]] / total - share[ind[k]]))
    for g in by_share:  # the largest-share absent group
        if stamp[g] != tag:
            return max(worst, share[g])
    return worst


@numba.njit(cache=True)
def _score(rows, ptr, ind, dat, lengths, share, soff, by_share, buf, stamp, tag):
    """The batch's score: the largest :func:`_group_dev` of the families (family f: rows ``ptr[f]``
    of ``ind`` / ``dat``, groups ``soff[f]:soff[f + 1]`` of ``share``, ``by_share``, the scratch)."""
    worst = 0.0
    for f in range(ptr.shape[0]):
        s0, s1 = soff[f], soff[f + 1]
        worst = max(worst, _group_dev(rows, ptr[f], ind, dat, lengths, share[s0:s1], by_share[s0:s1], buf[s0:s1], stamp[s0:s1], tag))
    return worst


@numba.njit(cache=True)
def _fill(rows, skip, ptr, ind, dat, lengths, tokens, hits, present):
    """Tokens and entries per group of ``rows`` but the ``skip``-th (-1: none) into ``tokens`` and
    ``hits`` (zero on entry); the groups with an entry listed in ``present``. Returns (total
    length, groups listed)."""
    total = 0.0
    n = 0
    for t in range(rows.size):
        if t == skip:
            continue
        r = rows[t]
        total += lengths[r]
        for k in range(ptr[r], ptr[r + 1]):
            g = ind[k]
            if hits[g] == 0:
                present[n] = g
                n += 1
            hits[g] += 1
            tokens[g] += dat[k]
    return total, n


@numba.njit(cache=True)
def _move(r, sign, ptr, ind, dat, tokens, hits) -> None:
    """Add (``sign`` 1) or take away (-1) row r's entries."""
    for k in range(ptr[r], ptr[r + 1]):
        tokens[ind[k]] += sign * dat[k]
        hits[ind[k]] += sign


@numba.njit(cache=True)
def _clear(present, n, tokens, hits) -> None:
    for t in range(n):
        tokens[present[t]] = 0.0
        hits[present[t]] = 0


@numba.njit(cache=True)
def _dev_below(tokens, hits, total, present, n, extra, ptr, ind, share, by_share, hot, limit):
    """:func:`_group_dev` of the rows whose sums are ``tokens`` / ``hits`` (the groups with an entry:
    ``present[:n]`` and row ``extra``'s; those with hits 0 are absent), or inf as soon as a term
    reaches ``limit``. Group ``hot`` (-1: none) is looked at first: its term is at most the
    deviation whether it is present or absent, so a swap that leaves it at ``limit`` or above is
    dropped after one term. Sums of whole numbers are exact in any order: the same value as
    :func:`_group_dev` of the rows themselves."""
    if hot >= 0 and abs(tokens[hot] / total - share[hot]) >= limit:
        return np.inf
    worst = 0.0
    for g in by_share:  # the largest-share absent group
        if hits[g] == 0:
            worst = share[g]
            break
    if worst >= limit:
        return np.inf
    for t in range(n):
        g = present[t]
        if hits[g] > 0:
            d = abs(tokens[g] / total - share[g])
            if d >= limit:
                return np.inf
            worst = max(worst, d)
    if extra >= 0:
        for k in range(ptr[extra], ptr[extra + 1]):
            d = abs(tokens[ind[k]] / total - share[ind[k]])
            if d >= limit:
                return np.inf
            worst = max(worst, d)
    return worst


@numba.njit(cache=True)
def _worst_group(rows, ptr, ind, dat, lengths, share, by_share, tokens, hits, present) -> tuple[int, float]:
    """The group whose term is ``rows``' deviation (:func:`_group_dev`), present or the
    largest-share absent one, and the deviation."""
    total, n = _fill(rows, -1, ptr, ind, dat, lengths, tokens, hits, present)
    best, worst = -1, -1.0
    for t in range(n):
        d = abs(tokens[present[t]] / total - share[present[t]])
        if d > worst:
            best, worst = present[t], d
    for g in by_share:
        if hits[g] == 0:
            if share[g] > worst:
                best, worst = g, share[g]
            break
    _clear(present, n, tokens, hits)
    return best, worst


@numba.njit(cache=True)
def _into_a(total, n, others, ptr, ind, dat, lengths, share, by_share, hot, limit, tokens, hits, present, score) -> None:
    """One family's deviation of a batch with one row replaced by each row of ``others`` in turn:
    ``score[j]`` = max(score[j], dev), inf once a term reaches ``limit`` (j already inf: skipped).
    ``tokens`` / ``hits`` / ``present[:n]`` and ``total`` are the batch's sums without the row that
    leaves (:func:`_fill`); each row j is added and taken away again."""
    for j in range(others.size):
        if score[j] == np.inf:
            continue
        r = others[j]
        _move(r, 1, ptr, ind, dat, tokens, hits)
        score[j] = max(score[j], _dev_below(tokens, hits, total + lengths[r], present, n, r, ptr, ind, share, by_share, hot, limit))
        _move(r, -1, ptr, ind, dat, tokens, hits)


@numba.njit(cache=True)
def _into_b(rows, r_in, ptr, ind, dat, lengths, share, by_share, limit, tokens, hits, present, score) -> None:
    """One family's deviation of batch ``rows`` with its j-th row replaced by row ``r_in``, for each
    j: ``score[j]`` as in :func:`_into_a`. The whole batch is summed once; for each j its row is
    taken away and ``r_in`` added, then both undone."""
    total, n = _fill(rows, -1, ptr, ind, dat, lengths, tokens, hits, present)
    for j in range(rows.size):
        if score[j] == np.inf:
            continue
        r_out = rows[j]
        _move(r_out, -1, ptr, ind, dat, tokens, hits)
        _move(r_in, 1, ptr, ind, dat, tokens, hits)
        score[j] = max(score[j], _dev_below(tokens, hits, total - lengths[r_out] + lengths[r_in], present, n, r_in, ptr, ind, share,
                                            by_share, -1, limit))
        _move(r_in, -1, ptr, ind, dat, tokens, hits)
        _move(r_out, 1, ptr, ind, dat, tokens, hits)
    _clear(present, n, tokens, hits)


@numba.njit(cache=True, parallel=True)
def _wave_best(order, batch, wave, reach, dev, ptr, ind, dat, lengths, share, soff, by_share):
    """For each batch a of ``wave`` (their windows of batches ``[a - reach, a + reach]`` pairwise
    disjoint): the lowest max(dev of batch a, dev of batch b) after swapping a's i-th and b's j-th
    sequence, over every b of a's window but a and every (i, j), if it is below ``dev[a]``, and its
    index k = ((b - lo) * batch + i) * batch + j, the first in loop order (b, i, j) among equal
    scores (what ``np.argmin`` of every swap's score gives); else inf and -1. The families are laid
    out as in :func:`_score`.

    One (a, i) a task, all of the wave's in one parallel pass, each with its own scratch arrays:
    batch a without its i-th row is summed once, batch b once for each b it still has a swap with,
    and each candidate row is added and taken away again (sums of whole numbers are exact in any
    order, so every score below ``dev[a]`` is the one summing the swapped batches gives). A swap is
    dropped at its first term that reaches ``dev[a]`` (it cannot win), a's worst groups first, so
    most swaps are dropped after one term."""
    n_wave, nb, n_fam = wave.size, order.size // batch, ptr.shape[0]
    n_groups = soff[n_fam]
    widest = 0
    for f in range(n_fam):
        widest = max(widest, soff[f + 1] - soff[f])
    hot = np.empty((n_wave, n_fam), np.int64)
    fam_order = np.empty((n_wave, n_fam), np.int64)
    for t in numba.prange(n_wave):  # a's worst group in each family: the one its deviation comes from
        rows_a = order[wave[t] * batch : (wave[t] + 1) * batch]
        devs = np.empty(n_fam)
        for f in range(n_fam):
            s0, s1 = soff[f], soff[f + 1]
            tokens, hits, present = np.zeros(s1 - s0), np.zeros(s1 - s0, np.int64), np.empty(s1 - s0, np.int64)
            hot[t, f], devs[f] = _worst_group(rows_a, ptr[f], ind, dat, lengths, share[s0:s1], by_share[s0:s1], tokens, hits, present)
        # the family whose worst group makes a's deviation drops most swaps: it goes first
        fam_order[t] = np.argsort(-devs, kind="mergesort")
    task_score, task_k = np.full(n_wave * batch, np.inf), np.full(n_wave * batch, -1, np.int64)
    for task in numba.prange(n_wave * batch):
        t, i = task // batch, task % batch
        a = wave[t]
        lo, hi, limit = max(0, a - reach), min(nb, a + reach + 1), dev[a]
        rows_a = order[a * batch : (a + 1) * batch]
        # a's sums without its i-th row, per family (they stay for every b)
        a_tok, a_hit, a_pres = np.zeros(n_groups), np.zeros(n_groups, np.int64), np.empty(n_groups, np.int64)
        a_total, a_n = np.empty(n_fam), np.empty(n_fam, np.int64)
        for f in range(n_fam):
            s0, s1 = soff[f], soff[f + 1]
            a_total[f], a_n[f] = _fill(rows_a, i, ptr[f], ind, dat, lengths, a_tok[s0:s1], a_hit[s0:s1], a_pres[s0:s1])
        tok, hit, pres = np.zeros(widest), np.zeros(widest, np.int64), np.empty(widest, np.int64)  # scratch for batch b's sums
        best, best_k = np.inf, -1
        for b in range(lo, hi):
            if b == a:
                continue
            rows_b = order[b * batch : (b + 1) * batch]
            score = np.zeros(batch)
            for q in range(n_fam):
                f = fam_order[t, q]
                s0, s1 = soff[f], soff[f + 1]
                _into_a(a_total[f], a_n[f], rows_b, ptr[f], ind, dat, lengths, share[s0:s1], by_share[s0:s1], hot[t, f], limit,
                        a_tok[s0:s1], a_hit[s0:s1], a_pres[s0:s1], score)
                if np.isinf(score).all():  # no swap of a's i-th row with this batch is left
                    break
            if np.isinf(score).all():
                continue
            for f in range(n_fam):
                s0, s1 = soff[f], soff[f + 1]
                _into_b(rows_b, rows_a[i], ptr[f], ind, dat, lengths, share[s0:s1], by_share[s0:s1], limit, tok, hit, pres, score)
            for j in range(batch):  # k grows with (b, j) for this i: the first of equal scores is kept
                if score[j] < best:
                    best, best_k = score[j], ((b - lo) * batch + i) * batch + j
        task_score[task], task_k[task] = best, best_k
    out_score, out_k = np.full(n_wave, np.inf), np.full(n_wave, -1, np.int64)
    for t in range(n_wave):  # each a's best over its i: the lowest score, then the lowest k
        for task in range(t * batch, (t + 1) * batch):
            s, k = task_score[task], task_k[task]
            if k >= 0 and (s < out_score[t] or (s == out_score[t] and k < out_k[t])):
                out_score[t], out_k[t] = s, k
    return out_score, out_k


@numba.njit(cache=True, parallel=True)
def _batch_scores(order, batch, ptr, ind, dat, lengths, share, soff, by_share):
    """:func:`_score` of every full batch of ``order``, in chunks of batches on every core (each
    chunk with its own scratch arrays; a batch's score does not depend on them)."""
    nb = order.size // batch
    dev = np.empty(nb)
    chunks = min(nb, 64)
    for c in numba.prange(chunks):
        buf, stamp = np.zeros(share.size), np.full(share.size, -1, np.int64)
        tag = 0
        for a in range(c * nb // chunks, (c + 1) * nb // chunks):
            dev[a] = _score(order[a * batch : (a + 1) * batch], ptr, ind, dat, lengths, share, soff, by_share, buf, stamp, tag)
            tag += 1
    return dev


@numba.njit(cache=True)
def _repair(order, batch, ptr, ind, dat, lengths, share, soff, by_share, n_fix, reach):
    """Swap-repair ``order`` in place; return the number of swaps.

    The ``n_fix`` worst batches are taken worst first; each takes the first swap in loop order
    (b, i, j) with the lowest max(dev a, dev b) below a's dev, if any: the swap a sequential scan
    keeping the strictly better one would pick. They are scored in waves (:func:`_wave_best`, one
    parallel pass each): the next batches in that order whose windows ``[a - reach, a + reach]``
    share no batch (at most :data:`WAVE` of them). A swap changes only batches of its own window,
    so no batch of a wave sees another's swap, and applying the wave's swaps in order gives the
    swaps of one batch at a time."""
    nb = order.size // batch
    buf, stamp = np.zeros(share.size), np.full(share.size, -1, np.int64)
    tag = 0
    dev = _batch_scores(order, batch, ptr, ind, dat, lengths, share, soff, by_share)
    todo = np.argsort(-dev, kind="mergesort")[:n_fix]
    taken = np.zeros(nb, np.bool_)  # batches of the windows of the wave being gathered
    swaps, p = 0, 0
    while p < todo.size:
        q = p
        while q < todo.size and q - p < WAVE:
            lo, hi = max(0, todo[q] - reach), min(nb, todo[q] + reach + 1)
            if taken[lo:hi].any():
                break
            taken[lo:hi] = True
            q += 1
        wave = todo[p:q]
        best, where = _wave_best(order, batch, wave, reach, dev, ptr, ind, dat, lengths, share, soff, by_share)
        for t in range(wave.size):
            a = wave[t]
            lo = max(0, a - reach)
            taken[lo : min(nb, a + reach + 1)] = False
            if best[t] < dev[a]:
                k = where[t]
                b, i, j = lo + k // (batch * batch), (k // batch) % batch, k % batch
                pa, pb = a * batch + i, b * batch + j
                order[pa], order[pb] = order[pb], order[pa]
                for c in (a, b):
                    dev[c] = _score(order[c * batch : (c + 1) * batch], ptr, ind, dat, lengths, share, soff, by_share, buf, stamp, tag)
                    tag += 1
                swaps += 1
        p = q
    return swaps


def _stacked(mats: Sequence[Csr], total: float) -> tuple[np.ndarray, ...]:
    """The families' matrices laid out for the kernels: row pointers ``ptr[f]`` into the joined
    ``ind`` (groups numbered within the family) and ``dat``; each group's token share (``share``,
    family f's at ``soff[f]:soff[f + 1]``) and each family's groups by descending share."""
    ptr = np.empty((len(mats), mats[0].n_rows + 1), np.int64)
    start = 0
    for f, x in enumerate(mats):
        ptr[f] = x.indptr + start
        start += int(x.indptr[-1])
    ind = np.concatenate([np.asarray(x.indices, np.int64) for x in mats])
    dat = np.concatenate([np.asarray(x.data, np.float64) for x in mats])
    shares = [x.column_totals() / total for x in mats]
    soff = np.cumsum([0] + [s.size for s in shares]).astype(np.int64)
    by_share = np.concatenate([np.argsort(-s, kind="mergesort") for s in shares]).astype(np.int64)
    return ptr, ind, dat, np.concatenate(shares).astype(np.float64), soff, by_share


def repair_batches(
    order: np.ndarray, features: SequenceFeatures, batch_size: int, fraction: float = REPAIR_FRACTION, reach: int = REPAIR_REACH,
    passes: int = REPAIR_PASSES, families: Sequence[TokenFamily] | None = None,
) -> tuple[np.ndarray, int]:
    """The order (rows of ``features``) with its worst batches of ``batch_size`` sequences
    swap-repaired, and the number of swaps. ``families``: the token families a batch is scored on
    (default: the registry's ``repaired`` ones, ``pipeline/ordering/families/``)."""
    order = np.array(order, dtype=np.int64)
    n_batches = order.size // max(int(batch_size), 1)
    fams = registered_repaired() if families is None else tuple(families)
    if batch_size < 1 or n_batches < 2 or not fams:
        return order, 0
    total = float(features.lengths.sum())
    ptr, ind, dat, share, soff, by_share = _stacked([f.tokens(features) for f in fams], total)
    n_fix = max(1, int(fraction * n_batches))
    swaps = 0
    for _ in range(int(passes)):
        swaps += _repair(order, int(batch_size), ptr, ind, dat, np.asarray(features.lengths, dtype=np.float64), share, soff, by_share,
                         n_fix, int(reach))
    return order, int(swaps)
