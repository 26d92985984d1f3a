"""Greedy mixture-adherent ordering of sequences (Don't Shuffle, Optimize f1/f2/f3; TerRIFIC curricula J_sched).

Objective over the families of ``pipeline.ordering.characteristics`` (their columns scaled by
sqrt(weight), token columns first)::

    f(s) = sum_{g token} [(X_g + x_sg) - t_g (S + l_s)]^2 + sum_{g seq} [(X_g + x_sg) - t_g (W + u)]^2

It is TerRIFIC curricula's boxed J_sched with l_s when the families are cluster + lam * length_bin,
and Don't Shuffle, Optimize's f3 when every l_s = L (f1: cluster alone; f2: cluster + lam * the
single column ||c_s||_2 with target rho, i.e. lam (N + n_s - rho (S + l_s))^2). Sequence
families count a sequence as ``u`` (= mean l_s) in its class column; W = u * (sequences picked).
Writing Q_s = <X, x_s>, a_s = <t_tok, x_s>, b_s = <t_seq, x_s> and
A_s = ||x_tok,s - t_tok l_s||^2 + ||x_seq,s - t_seq u||^2,

    f(s) = const + A_s + 2 Q_s - 2 S a_s - 2 l_s G - 2 W b_s,   G = <X_tok, t_tok> - S ||t_tok||^2.

Only Q_s depends on the choice history per sequence, and it changes only for sequences sharing a
column with the chosen one: the exact greedy updates those through inverted lists and evaluates
the O(1) score of every remaining sequence per step (O(M^2) cheap operations instead of the brute
force's O(M^2 G)).

Tie-break (deterministic, shared with the brute-force reference in the tests): scores within
``tie_tolerance`` (1e-9 * max(l_s, u)^2 * the sum of the family weights) of the step's minimum are
ties, and the lowest sequence row wins. The tolerance absorbs floating-point rounding, which
differs between algebraically equal forms of f, so both forms pick the same sequence.

Noise (TerRIFIC curricula "Injecting Noise"): eps_s ~ N(0, (sigma * Lbar^2)^2) i.i.d. per remaining
sequence per step is added to f(s); sigma is therefore in units of Lbar^2 squared tokens
(Lbar = mean sequence length), the scale of the score of one full off-target sequence.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import numba
import numpy as np
from tqdm import tqdm

from pipeline.config import config_default
from pipeline.errors import StrataInputError
from pipeline.ordering.characteristics import Characteristics, Family, characteristics, objective_families
from pipeline.ordering.features import Csr, SequenceFeatures
from pipeline.ordering.repair import repair_batches
from pipeline.segments import ids_by_key, stable_argsort
from pipeline.threads import concurrently

TIE_RTOL = 1e-9


def tie_tolerance(max_length: float, total_weight: float) -> float:
    """Scores closer than this to the step minimum are ties (lowest row wins)."""
    return TIE_RTOL * float(max_length) ** 2 * float(total_weight)


@dataclass(frozen=True)
class Objective:
    """The families the greedy balances (``pipeline.ordering.characteristics``)."""

    families: tuple[Family, ...]

    @staticmethod
    def named(objective: str, lam: float = 1.0, families: Sequence[str | Family] = ()) -> "Objective":
        """A preset (f1, f2, f3, stationary) or, with ``objective="custom"``, the given families."""
        return Objective(objective_families(objective, lam, families))

    @property
    def total_weight(self) -> float:
        return float(sum(f.weight for f in self.families))

    def matrix(self, features: SequenceFeatures) -> Characteristics:
        return characteristics(features, self.families)

    def __str__(self) -> str:
        return ",".join(map(str, self.families))


@dataclass
class GreedyState:
    """Running totals X (every column of the objective), S (tokens) and n (sequences) of the prefix."""

    X: np.ndarray
    S: float = 0.0
    n: int = 0

    @staticmethod
    def empty(n_cols: int) -> "GreedyState":
        return GreedyState(np.zeros(n_cols))


def _columns(c: Csr) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inverted lists (CSC) of a CSR matrix: column -> (rows, values), rows ascending."""
    order = np.argsort(c.indices, kind="stable")
    rows = np.repeat(np.arange(c.n_rows, dtype=np.int64), np.diff(c.indptr))[order]
    ptr = np.zeros(c.n_cols + 1, dtype=np.int64)
    np.cumsum(np.bincount(c.indices, minlength=c.n_cols), out=ptr[1:])
    return ptr, rows, c.data[order]


DEAD = 1e300  # score offset of scheduled rows (finite, so the fastmath scan stays valid)


@numba.njit(cache=True, fastmath=True)
def _scan(buf, A, Q, a, b, l, n, S, G, W):
    """buf = scores of rows 0..n-1 (f up to a constant); return their minimum."""
    best = DEAD
    for i in range(n):
        sc = A[i] + 2.0 * Q[i] - 2.0 * S * a[i] - 2.0 * l[i] * G - 2.0 * W * b[i]
        buf[i] = sc
        best = min(best, sc)
    return best


@numba.njit(cache=True)
def _compact_lists(ptr, rows, vals, newidx):
    """Drop scheduled rows from inverted lists and renumber the live ones (order kept)."""
    w = 0
    start = 0
    for j in range(ptr.size - 1):
        end = ptr[j + 1]
        for t in range(start, end):
            r = newidx[rows[t]]
            if r >= 0:
                rows[w] = r
                vals[w] = vals[t]
                w += 1
        start = end
        ptr[j + 1] = w


@numba.njit(cache=True, nogil=True)
def _greedy_kernel(xptr, xind, xdat, col_ptr, col_rows, col_vals, n_tok, lengths, unit, t, X, S0, n0, n_pick, tol,
                   sigma, seed):  # fmt: skip
    """Exact greedy; the inverted lists (col_*) are modified in place. Returns picked rows, S, n."""
    m = lengths.size
    tt = 0.0
    uu = 0.0
    GT = 0.0
    for j in range(t.size):
        if j < n_tok:
            tt += t[j] * t[j]
            GT += X[j] * t[j]
        else:
            uu += t[j] * t[j]
    # live arrays, indexed by live slot; slots keep the row order (ties -> lowest slot = lowest row)
    A = np.empty(m)
    a = np.empty(m)
    b = np.empty(m)
    l = np.empty(m)
    Q = np.empty(m)
    row = np.arange(m)
    for r in range(m):
        lr = lengths[r]
        xx = 0.0
        ar = 0.0
        br = 0.0
        qr = 0.0
        for k in range(xptr[r], xptr[r + 1]):
            j = xind[k]
            x = xdat[k]
            xx += x * x
            qr += X[j] * x
            if j < n_tok:
                ar += t[j] * x
            else:
                br += t[j] * x
        A[r] = xx - 2.0 * lr * ar + lr * lr * tt - 2.0 * unit * br + unit * unit * uu
        a[r] = ar
        b[r] = br
        Q[r] = qr
        l[r] = lr
    if sigma > 0.0:
        np.random.seed(seed)
    buf = np.empty(m)
    out = np.empty(n_pick, dtype=np.int64)
    S = S0
    npk = n0
    n = m  # live slots 0..n-1 (scheduled ones carry DEAD until the next compaction)
    alive = m
    newidx = np.empty(m, dtype=np.int64)
    for step in range(n_pick):
        best = _scan(buf, A, Q, a, b, l, n, S, GT - S * tt, unit * npk)
        if sigma > 0.0:
            best = DEAD
            for i in range(n):
                if A[i] < DEAD:
                    buf[i] += sigma * np.random.standard_normal()
                    best = min(best, buf[i])
        limit = best + tol
        i = 0
        while not (buf[i] <= limit and A[i] < DEAD):
            i += 1
        r = row[i]
        out[step] = r
        A[i] = DEAD
        alive -= 1
        for k in range(xptr[r], xptr[r + 1]):
            j = xind[k]
            c = xdat[k]
            X[j] += c
            if j < n_tok:
                GT += t[j] * c
            for q in range(col_ptr[j], col_ptr[j + 1]):
                Q[col_rows[q]] += c * col_vals[q]
        S += lengths[r]
        npk += 1
        if alive * 2 <= n and n > 256:
            w = 0
            for s in range(n):
                if A[s] < DEAD:
                    newidx[s] = w
                    A[w] = A[s]
                    a[w] = a[s]
                    b[w] = b[s]
                    l[w] = l[s]
                    Q[w] = Q[s]
                    row[w] = row[s]
                    w += 1
                else:
                    newidx[s] = -1
            n = w
            _compact_lists(col_ptr, col_rows, col_vals, newidx)
    return out, S, npk


def greedy_rows(
    chars: Characteristics,
    lengths: np.ndarray,
    targets: np.ndarray,
    state: GreedyState,
    n_pick: int | None = None,
    noise: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """Run the exact greedy on these rows from ``state`` (updated in place); return picked rows.

    ``targets`` = t of ``chars.targets`` (the rows' own, or global ones); ``n_pick`` < number of
    rows stops early (the windowed mode continues from the state).
    """
    m = lengths.size
    n_pick = m if n_pick is None else int(n_pick)
    if noise < 0 or not np.isfinite(noise):
        raise StrataInputError(f"noise sigma={noise} is impossible", fix="use a finite sigma >= 0 (0 = deterministic)")
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    x = chars.x
    lengths = np.asarray(lengths, dtype=np.float64)
    tol = tie_tolerance(max(lengths.max(), chars.unit), chars.total_weight)
    sigma = float(noise) * float(lengths.mean()) ** 2
    out, S, n = _greedy_kernel(
        x.indptr, x.indices, x.data, *_columns(x), chars.n_token_cols, lengths, chars.unit,
        np.asarray(targets, dtype=np.float64), state.X, float(state.S), int(state.n), n_pick, tol, sigma,
        int(seed) % (2**32),
    )  # fmt: skip
    state.S, state.n = float(S), int(n)
    return out


def greedy_order(features: SequenceFeatures, objective: Objective, noise: float = 0.0, seed: int = 0) -> np.ndarray:
    """Exact greedy over ``objective``'s families: rows of ``features`` in schedule order."""
    chars = objective.matrix(features)
    state = GreedyState.empty(chars.n_cols)
    return greedy_rows(chars, features.lengths, chars.targets(features.lengths), state, None, noise, seed)


def _dominant(x: Csr) -> np.ndarray:
    """Each row's column with the most tokens (ties: lowest column); every row holds an entry."""
    return _row_argmax(x.indptr, x.indices, x.data)


@numba.njit(cache=True)
def _row_argmax(indptr, indices, data):
    out = np.empty(indptr.size - 1, np.int64)
    for r in range(indptr.size - 1):
        best, col = -np.inf, -1
        for k in range(indptr[r], indptr[r + 1]):
            if data[k] > best or (data[k] == best and indices[k] < col):
                best, col = data[k], indices[k]
        out[r] = col
    return out


def _stratified_keys(stratum: np.ndarray, within: np.ndarray, n_strata: int, rng: np.random.Generator) -> np.ndarray:
    """Key (i + u) / n_h for the i-th member (by ``within``) of stratum h; u ~ U(0, 1)."""
    by = within[ids_by_key(stratum[within], n_strata)]  # by stratum, in ``within``'s order inside one
    size = np.bincount(stratum, minlength=n_strata)
    start = np.cumsum(size) - size
    rank = np.empty(stratum.size, dtype=np.int64)
    rank[by] = np.arange(stratum.size) - start[stratum[by]]
    return (rank + rng.random(stratum.size)) / size[stratum]


def stratified_stream(features: SequenceFeatures, rng: np.random.Generator) -> np.ndarray:
    """Seeded shuffle whose every prefix holds each length bin and each cluster near its share.

    Strata are a sequence's dominant length bin and dominant cluster. Sorting by the key
    (i + u) / n_h spreads each stratum evenly; the members of a bin stratum are taken in the
    order of a cluster-stratified shuffle, so clusters are spread evenly too.
    """
    m = features.n_sequences
    ckey = _stratified_keys(_dominant(features.clusters), rng.permutation(m), features.clusters.n_cols, rng)
    bkey = _stratified_keys(_dominant(features.bins), stable_argsort(ckey), features.bins.n_cols, rng)
    return stable_argsort(bkey)


def greedy_windowed_order(
    features: SequenceFeatures, objective: Objective, window: int = 4096, seed: int = 0, noise: float = 0.0
) -> np.ndarray:
    """Fast approximate greedy: the exact greedy restricted to a sliding pool of candidates.

    Sequences stream into a pool of ``window`` candidates; each round the exact greedy (global
    targets, global running totals) picks half the pool, which is refilled. The stream is a
    stratified shuffle (``stratified_stream``): with a plain random stream the arrivals of each
    length bin / cluster drift from their share like a Brownian bridge and the pool runs out of
    the lagging ones mid-schedule (measured: bin deviation 0.019 -> 0.035 at mid-schedule, M=300k). Cost O(M * window) instead of O(M^2);
    memory O(M + window). The last pool is drained fully.
    """
    if window < 2:
        raise StrataInputError(f"window={window} is too small", fix="use a pool of at least 2 sequences (default 4096)")
    m = features.n_sequences
    chars = objective.matrix(features)
    targets = chars.targets(features.lengths)
    state = GreedyState.empty(chars.n_cols)
    stream = stratified_stream(features, np.random.default_rng(seed))
    pool = np.sort(stream[:window])
    nxt = pool.size
    picked: list[np.ndarray] = []
    step = max(1, window // 2)
    rnd = 0
    while pool.size:
        n_pick = pool.size if nxt >= m else min(step, pool.size)
        rows = greedy_rows(chars.take_rows(pool), features.lengths[pool], targets, state, n_pick, noise, seed + rnd)
        picked.append(pool[rows])
        keep = np.ones(pool.size, dtype=bool)
        keep[rows] = False
        refill = stream[nxt : nxt + n_pick]
        nxt += refill.size
        pool = np.sort(np.concatenate([pool[keep], refill]))
        rnd += 1
    return np.concatenate(picked)


EXACT_MAX: int = config_default("greedy_exact_max")  # largest M ordered by the exact greedy (O(M^2))
BLOCK: int = config_default("greedy_block")  # sequences per block of the blocked mode
BATCH_SIZE: int = config_default("batch_size")  # sequences per training batch: the repair's batches
REPAIR: bool = config_default("greedy_repair")
POOL_SLACK = 0.5  # the blocked mode's deal picks a block from a pool of (1 + POOL_SLACK) blocks
HEAD_POOL = 16  # ... and its first block, in the order picked, from a pool of this many blocks
CARRY = 64  # sequences each block's order leaves to the next block's (two batches of 32)


def greedy_mode(n_sequences: int, greedy_exact_max: int = EXACT_MAX) -> str:
    """Which greedy ``greedy_scaled_order`` runs on ``n_sequences`` rows: exact up to ``greedy_exact_max``."""
    return "exact" if n_sequences <= greedy_exact_max else "blocked"


def block_sizes(n_rows: int, greedy_block: int) -> np.ndarray:
    """ceil(n_rows / greedy_block) block sizes differing by at most 1."""
    n_blocks = max(1, -(-n_rows // int(greedy_block)))
    return np.diff(np.linspace(0, n_rows, n_blocks + 1).round().astype(np.int64))


def tracked_blocks(
    chars: Characteristics,
    lengths: np.ndarray,
    targets: np.ndarray,
    state: GreedyState,
    stream: np.ndarray,
    greedy_block: int,
    noise: float = 0.0,
    seed: int = 0,
) -> Iterator[tuple[np.ndarray, bool]]:
    """Deal the rows into consecutive blocks whose *cumulative* composition tracks ``targets``.

    Rows enter a pool in ``stream`` order. Block i is the ``len(block i)`` rows the exact greedy
    (``greedy_rows``) picks from the pool, from ``state`` (the running totals X, S, n of every
    block dealt before, updated in place) against ``targets``; the pool keeps the rest and is
    refilled from the stream to (1 + ``POOL_SLACK``) blocks. So after each block the stream's
    running totals sit within the greedy's own tracking error of t * S (Don't Shuffle, Optimize's
    cumulative counts), instead of adding up the blocks' independent offsets; the rows the greedy
    passes over stay in the pool and are taken as soon as their groups lag. The last block is the
    pool's remainder: everything left, whose composition is then the targets' less what the
    stream is off by, by conservation.

    Yields (rows, ordered): ``ordered`` rows are already in schedule order, the others ascend (the
    exact greedy's tie-break) for the caller to order. The first block is picked from a pool of
    ``HEAD_POOL`` blocks and kept in the order picked: the first prefixes are a handful of
    sequences, whose fit to the targets depends on how many candidates the greedy sees (the
    exact greedy sees all M), and a block taken from a larger pool than it must drain has no
    tail to balance. The rest of that pool goes back to the head of the stream.
    """
    n = lengths.size
    sizes = block_sizes(n, greedy_block)
    if sizes.size == 1:
        yield np.sort(stream), False
        return
    head = np.sort(stream[: min(n, int(HEAD_POOL * int(greedy_block)))])
    first = greedy_rows(chars.take_rows(head), lengths[head], targets, state, int(sizes[0]), noise, seed)
    yield head[first], True
    taken = np.zeros(n, dtype=bool)
    taken[head[first]] = True
    stream = stream[~taken[stream]]  # the head pool's rest, back in stream order
    extra = int(round(POOL_SLACK * int(greedy_block)))
    pool = np.sort(stream[: sizes[1] + extra])
    nxt = pool.size
    for i in range(1, sizes.size):
        if i == sizes.size - 1:
            yield pool, False
            return
        picked = greedy_rows(chars.take_rows(pool), lengths[pool], targets, state, int(sizes[i]), noise, seed + i)
        keep = np.ones(pool.size, dtype=bool)
        keep[picked] = False
        refill = stream[nxt : nxt + int(sizes[i + 1])]
        nxt += refill.size
        yield np.sort(pool[picked]), False
        pool = np.sort(np.concatenate([pool[keep], refill]))


def _deviation_vector(state: GreedyState, targets: np.ndarray, chars: Characteristics) -> np.ndarray:
    """X - t (S, W): the running totals' offset from the targets (token columns against S, sequence
    columns against W = unit * n); a state (X = offset, S = 0, n = 0) scores as this one does."""
    k = chars.n_token_cols
    return state.X - np.concatenate([targets[:k] * state.S, targets[k:] * chars.unit * state.n])


def _blocks_in_order(chars: Characteristics, lengths: np.ndarray, blocks: Iterator[tuple[np.ndarray, bool]], n_blocks: int,
                     noise: float, seed: int) -> np.ndarray:
    """The blocks of ``blocks`` in schedule order, concatenated: each block not yet ordered is
    ordered by the exact greedy on its own targets from an empty state, together with the
    ``CARRY`` rows the block before left, and leaves its own last ``CARRY`` to the next block (the
    last block takes everything). Without the carry each block would end on the rows its greedy
    had no choice left about (the drained tail: a block's worst batches straddled its end); carried
    over, they are placed among a fresh block's rows. Each block's greedy starts from the offset
    X - t (S, W) at which the block before stopped (:func:`_deviation_vector`), not from zero, so the
    stream runs on across a block's edge as inside a block. The orderings run in block order on a worker
    thread while ``blocks`` deals the next block here (the kernel releases the GIL)."""
    bar = tqdm(total=n_blocks, desc="greedy blocks", unit="block", disable=n_blocks < 16)
    carry = np.zeros(0, dtype=np.int64)
    residual: np.ndarray | None = None  # the block before's X - t (S, W) where its order stopped

    def order(i: int, rows: np.ndarray, ordered: bool) -> np.ndarray:
        nonlocal carry, residual
        if not ordered:
            rows = np.sort(np.concatenate([rows, carry]))
            n_pick = rows.size if i == n_blocks - 1 or rows.size <= 2 * CARRY else rows.size - CARRY
            sub, ln = chars.take_rows(rows), lengths[rows]
            t = sub.targets(ln)
            state = GreedyState.empty(sub.n_cols) if residual is None else GreedyState(residual.copy())
            picked = greedy_rows(sub, ln, t, state, n_pick, noise, seed + n_blocks + i)
            residual = _deviation_vector(state, t, sub)
            left = np.ones(rows.size, dtype=bool)
            left[picked] = False
            rows, carry = rows[picked], rows[left]
        bar.update(1)
        return rows

    with ThreadPoolExecutor(1) as worker:  # one worker: block i's carry is block i + 1's input
        parts = [f.result() for f in [worker.submit(order, i, rows, ordered) for i, (rows, ordered) in enumerate(blocks)]]
    bar.close()
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def tracked_blocked_rows(
    chars: Characteristics,
    lengths: np.ndarray,
    targets: np.ndarray,
    state: GreedyState,
    stream: np.ndarray,
    greedy_block: int = BLOCK,
    noise: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """The blocked greedy on these rows from ``state`` against ``targets``: :func:`tracked_blocks`,
    each block then ordered on its own targets; rows in schedule order."""
    if greedy_block < 1:
        raise StrataInputError(f"greedy_block={greedy_block} is too small", fix=f"use blocks of at least 1 sequence (default {BLOCK})")
    lengths = np.asarray(lengths, dtype=np.float64)
    if lengths.size == 0:
        return np.zeros(0, dtype=np.int64)
    blocks = tracked_blocks(chars, lengths, targets, state, stream, greedy_block, noise, seed)
    return _blocks_in_order(chars, lengths, blocks, block_sizes(lengths.size, greedy_block).size, noise, seed)


def greedy_blocked_order(
    features: SequenceFeatures,
    objective: Objective,
    greedy_block: int = BLOCK,
    noise: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """Scalable greedy: a tracked deal into ceil(M / greedy_block) blocks, each ordered by the exact greedy
    on its own targets; O(M * greedy_block) instead of O(M^2), memory O(M) plus a pool and a block.

    1. The deal (:func:`tracked_blocks`): blocks picked in turn by the exact greedy from a pool of
       1.5 blocks fed by a seeded stratified stream (``stratified_stream``), from the running
       totals of the blocks before and against the global targets, so the stream's cumulative
       composition after every block stays on target: Don't Shuffle, Optimize's guarantee, "at all
       times during training, ... cumulative characteristic counts ... closer to our uniformity
       objective than random sampling", at every size. The first block comes from a pool of
       ``HEAD_POOL`` blocks in the order picked (the first prefixes, a few sequences each, fit the
       targets as well as the candidates they are picked from allow).
    2. Each later block ordered by the exact greedy with its *own* targets (its tau, kappa, rho) from an
       empty state. A block holds the global shares plus the small correction e_i - e_{i-1} of the
       stream's cumulative offset e, so inside it the cumulative offset moves from e_{i-1} to e_i
       about linearly, and the block drains balanced. Its last ``CARRY`` rows, those its greedy had
       no choice left about, go to the next block's order (:func:`_blocks_in_order`).

    Why both halves (docs/ordering.md "Greedy at scale" has the measurements): blocks dealt
    independently (every n-th row of the stratified stream) are excellent per batch, but their
    offsets from the global shares add up like a random walk, so past the first blocks the prefix
    error is no better than a shuffle's; one greedy with the global targets and a carried state over
    a sliding pool (``greedy_windowed_order``) tracks the prefix, but its pool fills with the
    sequences it passes over and its last pool, drained without refills, holds its worst batches.
    Ordering the tracked blocks from the carried state against the global targets instead of their
    own piles each block's small offset into its tail. The deal keeps the tracking and hands each
    block to the exact greedy whole; the rows the deal passes over are not lost, only moved to a
    later block.

    With ``greedy_block`` >= M there is one block and the order equals ``greedy_order``'s. Noise: the deal's
    round i draws its eps_s with seed ``seed + i``, block i's ordering with ``seed + n_blocks + i``.
    """
    if greedy_block < 1:
        raise StrataInputError(f"greedy_block={greedy_block} is too small", fix=f"use blocks of at least 1 sequence (default {BLOCK})")
    chars, stream = concurrently(lambda: objective.matrix(features),
                                 lambda: stratified_stream(features, np.random.default_rng(seed)))
    lengths = np.asarray(features.lengths, dtype=np.float64)
    state = GreedyState.empty(chars.n_cols)
    return tracked_blocked_rows(chars, lengths, chars.targets(lengths), state, stream, greedy_block, noise, seed)


def greedy_scaled_order(
    features: SequenceFeatures,
    objective: Objective,
    greedy_exact_max: int = EXACT_MAX,
    greedy_block: int = BLOCK,
    noise: float = 0.0,
    seed: int = 0,
    batch_size: int = BATCH_SIZE,
    *,
    greedy_repair: bool = REPAIR,
) -> tuple[np.ndarray, str]:
    """``greedy``: the exact greedy up to ``greedy_exact_max`` sequences, the blocked greedy above, then
    (``greedy_repair``) the swap repair of its worst training batches of
    ``batch_size`` sequences (4 passes over the worst 2%, ``pipeline.ordering.repair``); (rows, mode).
    Without the repair, in exact mode, with objective f1, f2 or f3, it is Don't Shuffle, Optimize's
    greedy as written.

    The repair is there in both modes because no greedy step looks at a whole batch: now and then
    the greedy must put two sequences of one group close together (in a block's tail, or where a
    sequence family holds a class at its share), and one swap with a nearby batch removes such
    rare batches without moving the mean or the stream's composition.
    """
    if greedy_exact_max < 0:
        raise StrataInputError(f"greedy_exact_max={greedy_exact_max} is impossible", fix=f"use an integer >= 0 (default {EXACT_MAX})")
    mode = greedy_mode(features.n_sequences, greedy_exact_max)
    if mode == "exact":
        order = greedy_order(features, objective, noise, seed)
    else:
        order = greedy_blocked_order(features, objective, greedy_block, noise, seed)
    return (repair_batches(order, features, batch_size)[0] if greedy_repair else order), mode


@dataclass(frozen=True)
class LeadIn:
    """Sequences placed before a prefix by someone else (a partitioned order's parts a frozen
    prefix fills): per token family its column totals, and their tokens and sequences."""

    totals: Mapping[str, np.ndarray]
    tokens: float
    sequences: int


def state_after(chars: Characteristics, lengths: np.ndarray, prefix_rows: np.ndarray,
                lead_in: LeadIn | None = None) -> tuple[GreedyState, np.ndarray]:
    """The running counts (X, S, n) after the prefix's rows, and the targets t of all rows; with a
    ``lead_in``, its sequences counted in both: token columns' totals and tokens added (their
    targets the shares of the rows and the lead-in together), sequence columns' at their targets
    (each part's quantile classes are its own)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    t = chars.targets(lengths)
    X = chars.take_rows(prefix_rows).column_totals().astype(np.float64)
    state = GreedyState(X, float(lengths[prefix_rows].sum()), int(len(prefix_rows)))
    if lead_in is None:
        return state, t
    k = chars.n_token_cols
    add = np.zeros(chars.n_cols)
    for name, vec in lead_in.totals.items():
        a, b = chars.family_columns[name]
        if b - a != vec.size:
            raise ValueError(f"the lead-in's {name!r} has {vec.size} columns, the rows' family {b - a}")
        add[a:b] = vec
    t[:k] = (chars.column_totals()[:k] + add[:k]) / (lengths.sum() + lead_in.tokens)
    add[k:] = t[k:] * chars.unit * lead_in.sequences
    return GreedyState(X + add, state.S + lead_in.tokens, state.n + int(lead_in.sequences)), t


def greedy_blocked_after(
    features: SequenceFeatures,
    prefix_rows: np.ndarray,
    objective: Objective,
    greedy_block: int = BLOCK,
    noise: float = 0.0,
    seed: int = 0,
    lead_in: LeadIn | None = None,
) -> np.ndarray:
    """The blocked greedy of the rows not in ``prefix_rows``, continued from the prefix: the deal
    (:func:`tracked_blocks`) starts from the prefix's running counts (X, S, n) with the targets of
    *all* rows, so its first blocks spend the suffix's surplus of the prefix's lagging groups and
    the whole stream's cumulative error returns toward zero as fast as a pool allows; then each
    block is ordered on its own targets, as in :func:`greedy_blocked_order`. ``lead_in``: sequences
    before the prefix, counted as :func:`state_after` does."""
    prefix_rows = np.asarray(prefix_rows, dtype=np.int64)
    rest = np.setdiff1d(np.arange(features.n_sequences), prefix_rows)
    if rest.size == 0:
        return rest
    chars, stream = concurrently(lambda: objective.matrix(features),
                                 lambda: stratified_stream(features.take_rows(rest), np.random.default_rng(seed)))
    lengths = np.asarray(features.lengths, dtype=np.float64)
    state, targets = state_after(chars, lengths, prefix_rows, lead_in)
    rows = tracked_blocked_rows(chars.take_rows(rest), lengths[rest], targets, state, stream, greedy_block, noise, seed)
    return rest[rows]


def greedy_after_prefix(
    features: SequenceFeatures,
    prefix_rows: np.ndarray,
    objective: Objective,
    greedy_exact_max: int = EXACT_MAX,
    greedy_block: int = BLOCK,
    noise: float = 0.0,
    seed: int = 0,
    batch_size: int = BATCH_SIZE,
    *,
    greedy_repair: bool = REPAIR,
    lead_in: LeadIn | None = None,
) -> np.ndarray:
    """The rows not in ``prefix_rows`` in ``greedy`` order after a frozen prefix: the greedy starts
    from the prefix's running counts (X, S, n) with the targets of *all* rows, so the whole stream's
    cumulative error returns toward zero as fast as the greedy allows; then the swap repair of the
    suffix's batches (``greedy_repair``). Up to ``greedy_exact_max`` suffix rows the exact greedy continues from the prefix;
    above, :func:`greedy_blocked_after` (a catch-up phase from the prefix's counts, then blocks).
    ``lead_in``: sequences before the prefix (a partitioned order's parts the prefix fills), counted
    as :func:`state_after` does."""
    rest = np.setdiff1d(np.arange(features.n_sequences), prefix_rows)
    if rest.size == 0:
        return rest
    sub = features.take_rows(rest)
    if greedy_mode(rest.size, greedy_exact_max) == "blocked":
        after = greedy_blocked_after(features, prefix_rows, objective, greedy_block, noise, seed, lead_in)
        local = np.searchsorted(rest, after)
        return rest[repair_batches(local, sub, batch_size)[0] if greedy_repair else local]
    chars = objective.matrix(features)
    state, targets = state_after(chars, features.lengths, np.asarray(prefix_rows, dtype=np.int64), lead_in)
    picked = greedy_rows(chars.take_rows(rest), features.lengths[rest], targets, state, None, noise, seed)
    return rest[repair_batches(picked, sub, batch_size)[0] if greedy_repair else picked]
