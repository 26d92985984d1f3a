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

from dataclasses import dataclass
from typing import Sequence

import numba
import numpy as np
from tqdm import tqdm

from pipeline.errors import StrataInputError
from pipeline.ordering.characteristics import Characteristics, Family, characteristics, objective_families
from pipeline.ordering.features import Csr, SequenceFeatures
from pipeline.ordering.repair import repair_batches
from pipeline.segments import ids_by_key, stable_argsort
from pipeline.threads import concurrently, parallel_map

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
    the lagging ones mid-schedule (measured: bin deviation 0.019 -> 0.035 at mid-schedule, M=300k). Cost O(M * window) instead of O(M^2); memory O(M + window). The last pool
    is drained fully.
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


EXACT_MAX = 100_000  # default `greedy_exact_max`: largest M ordered by the exact greedy (~17 s at 100k, one core)
BLOCK = 8_192  # default `greedy_block`: sequences per block of the blocked mode


def greedy_mode(n_sequences: int, exact_max: int = EXACT_MAX) -> str:
    """Which greedy ``greedy_scaled_order`` runs on ``n_sequences`` rows: exact up to ``exact_max``."""
    return "exact" if n_sequences <= exact_max else "blocked"


def stratified_blocks(features: SequenceFeatures, n_blocks: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Split the rows into ``n_blocks`` blocks (sizes differ by at most 1) of near-global composition.

    Block i gets every ``n_blocks``-th row of the stratified stream (``stratified_stream``) from
    row i: each dominant-cluster and each dominant-length-bin stratum is dealt evenly over the
    blocks. Rows inside a block ascend (the exact greedy's tie-break).
    """
    stream = stratified_stream(features, rng)
    return [np.sort(stream[i::n_blocks]) for i in range(n_blocks)]


def greedy_blocked_order(
    features: SequenceFeatures,
    objective: Objective,
    block: int = BLOCK,
    noise: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """Scalable greedy: the exact greedy on each of ceil(M / block) stratified blocks, concatenated.

    Each block (``stratified_blocks``) is an independent instance of the exact greedy with its own
    targets (the block's tau, kappa, rho) and an empty prefix state; the schedule is block 0's order,
    then block 1's, and so on (``greedy_scaled_order`` then repairs the worst batches). Cost
    O(M * block) instead of O(M^2), the blocks on a thread a core; memory O(M) plus a block a core.

    Why this and not the alternatives (measured on bench_order's instances, K=1000, B=100, batch 32):

    - The per-batch quality the greedy buys is local: it keeps every prefix of its schedule near the
      targets, so each batch holds about the targets' shares, and its per-batch deviation statistics
      do not depend on M (exact greedy: mean max deviation 0.0283 for clusters at M=25k, 50k, 100k).
      A block dealt from the stratified stream has nearly the global composition, so the exact
      greedy inside it reaches nearly the same per-batch deviation (M=100k, blocks of 8,192:
      1.025x exact's mean for clusters, 1.021x for length bins; blocks of 16,384 gain about 0.5%
      for twice the time).
    - Each block uses its *own* targets so that it is drained balanced: the exact greedy keeps
      T ~ tau S, hence the rows it leaves are in the target proportions too, up to the block's end.
      With the global targets and the prefix state carried from block to block, each block's small
      composition offset from the global shares piles up in its tail (M=50k, blocks of 16,384:
      worst batch 0.573, against 0.035 with own targets). ``greedy_windowed_order`` has a tail of this
      kind: its last pool, drained without refills, holds its worst batches (0.421 at M=1M, 2x
      random's worst).
    - Keeping per-(cluster, length bin) "type" queues and scoring types would be exact at O(M*T),
      but packed sequences mix several documents (4.7 clusters per 2048-token sequence on the
      benchmark), so nearly every sequence is its own type.

    - The batch repair: a block's last batches are drained from what the block has left, and now and
      then the greedy must put two sequences of one group close together (two whole 2048-token
      sequences of one length bin in a batch of 32 deviate by 2 * 2048 / 65,536 - kappa_b ~ 0.052,
      more than random's median batch). Such batches are rare (M=10M before the repair: mean 0.021,
      worst of 312,500 batches 0.052 for length bins), so one swap of a sequence of each of the
      worst 0.1% of the batches with one of a neighbour batch removes them without moving the mean.

    With ``block`` >= M there is one block and the order equals ``greedy_order``'s.
    Noise: block i draws its eps_s with seed ``seed + i``.
    """
    if block < 1:
        raise StrataInputError(f"greedy block={block} is too small", fix=f"use blocks of at least 1 sequence (default {BLOCK})")
    m = features.n_sequences
    n_blocks = max(1, -(-m // int(block)))
    # independent passes (the blocks 0.36 s at 1.5 cores, the matrix 0.11 s on one, at 10M documents), side by side
    blocks, chars = concurrently(lambda: stratified_blocks(features, n_blocks, np.random.default_rng(seed)),
                                 lambda: objective.matrix(features))
    bar = tqdm(total=n_blocks, desc="greedy blocks", unit="block", disable=n_blocks < 16)

    def one(block: tuple[int, np.ndarray]) -> np.ndarray:
        i, rows = block
        sub, lengths = chars.take_rows(rows), features.lengths[rows]
        picked = greedy_rows(sub, lengths, sub.targets(lengths), GreedyState.empty(sub.n_cols), None, noise, seed + i)
        bar.update(1)
        return rows[picked]

    parts = parallel_map(one, list(enumerate(blocks)))  # independent blocks on a thread a core (the kernel releases the GIL)
    bar.close()
    return np.concatenate(parts)


def greedy_scaled_order(
    features: SequenceFeatures,
    objective: Objective,
    exact_max: int = EXACT_MAX,
    block: int = BLOCK,
    noise: float = 0.0,
    seed: int = 0,
    batch: int = 32,
) -> tuple[np.ndarray, str]:
    """``greedy``: the exact greedy up to ``exact_max`` sequences, the blocked greedy above, then the
    swap repair of its worst training batches of ``batch`` sequences (4 passes over the worst 2%,
    ``pipeline.ordering.repair``); (rows, mode).

    The repair is there in both modes because no greedy step looks at a whole batch: now and then
    the greedy must put two sequences of one group close together (in a block's tail, or where a
    sequence family holds a class at its share), and one swap with a nearby batch removes such
    rare batches without moving the mean or the stream's composition.
    """
    if exact_max < 0:
        raise StrataInputError(f"greedy_exact_max={exact_max} is impossible", fix=f"use an integer >= 0 (default {EXACT_MAX})")
    mode = greedy_mode(features.n_sequences, exact_max)
    if mode == "exact":
        order = greedy_order(features, objective, noise, seed)
    else:
        order = greedy_blocked_order(features, objective, block, noise, seed)
    return repair_batches(order, features, batch)[0], mode


def _deviation(state: GreedyState, targets: np.ndarray, chars: Characteristics) -> float:
    """||X - t (S, W)||: the running totals' distance from the targets (token columns against S,
    sequence columns against W = unit * n)."""
    k = chars.n_token_cols
    want = np.concatenate([targets[:k] * state.S, targets[k:] * chars.unit * state.n])
    return float(np.linalg.norm(state.X - want))


def greedy_blocked_after(
    features: SequenceFeatures,
    prefix_rows: np.ndarray,
    objective: Objective,
    block: int = BLOCK,
    noise: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """The blocked greedy of the rows not in ``prefix_rows``, continued from the prefix: a catch-up
    phase, then :func:`greedy_blocked_order` on what is left.

    A prefix off the targets leaves a suffix off them the other way; ordered by blocks of its own
    composition, the suffix would pull the whole stream's cumulative error back to zero only at its
    end. The catch-up phase instead runs the exact greedy from the prefix's running counts (X, S, n)
    with the targets of *all* rows over a pool of ``block`` candidates dealt from a stratified
    stream of the suffix (``stratified_stream``), picking half the pool per round and refilling it,
    like :func:`greedy_windowed_order`, until a round no longer shrinks the whole stream's deviation
    ||X - t (S, W)|| by a tenth (the greedy's floor: recovered), at most half the suffix. It spends
    the suffix's surplus of the prefix's lagging groups first. The rest then holds about the
    targets' shares, so its own-target blocks keep the recovered stream near them.
    Cost O(catch-up * block) on top of the blocked greedy's.
    """
    if block < 1:
        raise StrataInputError(f"greedy block={block} is too small", fix=f"use blocks of at least 1 sequence (default {BLOCK})")
    prefix_rows = np.asarray(prefix_rows, dtype=np.int64)
    rest = np.setdiff1d(np.arange(features.n_sequences), prefix_rows)
    if rest.size == 0:
        return rest
    chars = objective.matrix(features)
    targets = chars.targets(features.lengths)
    state = GreedyState(chars.take_rows(prefix_rows).column_totals().astype(np.float64),
                        float(features.lengths[prefix_rows].sum()), int(prefix_rows.size))
    n_catch = rest.size // 2
    stream = rest[stratified_stream(features.take_rows(rest), np.random.default_rng(seed))]
    window = max(2, int(block))
    pool = np.sort(stream[:window])
    nxt = pool.size
    picked: list[np.ndarray] = []
    done, rnd = 0, 0
    dev = _deviation(state, targets, chars)
    while done < n_catch:
        n_pick = min(max(1, window // 2), n_catch - done)
        rows = greedy_rows(chars.take_rows(pool), features.lengths[pool], targets, state, n_pick, noise, seed + rnd)
        picked.append(pool[rows])
        done += rows.size
        keep = np.ones(pool.size, dtype=bool)
        keep[rows] = False
        refill = stream[nxt : nxt + rows.size]
        nxt += refill.size
        pool = np.sort(np.concatenate([pool[keep], refill]))
        rnd += 1
        before, dev = dev, _deviation(state, targets, chars)
        if dev > 0.9 * before:
            break
    head = np.concatenate(picked) if picked else np.zeros(0, np.int64)
    left = np.setdiff1d(rest, head)
    if left.size == 0:
        return head
    return np.concatenate([head, left[greedy_blocked_order(features.take_rows(left), objective, block, noise, seed + rnd)]])


def greedy_after_prefix(
    features: SequenceFeatures,
    prefix_rows: np.ndarray,
    objective: Objective,
    exact_max: int = EXACT_MAX,
    block: int = BLOCK,
    noise: float = 0.0,
    seed: int = 0,
    batch: int = 32,
) -> np.ndarray:
    """The rows not in ``prefix_rows`` in ``greedy`` order after a frozen prefix: the greedy starts
    from the prefix's running counts (X, S, n) with the targets of *all* rows, so the whole stream's
    cumulative error returns toward zero as fast as the greedy allows; then the swap repair of the
    suffix's batches. Up to ``exact_max`` suffix rows the exact greedy continues from the prefix;
    above, :func:`greedy_blocked_after` (a catch-up phase from the prefix's counts, then blocks)."""
    rest = np.setdiff1d(np.arange(features.n_sequences), prefix_rows)
    if rest.size == 0:
        return rest
    sub = features.take_rows(rest)
    if greedy_mode(rest.size, exact_max) == "blocked":
        after = greedy_blocked_after(features, prefix_rows, objective, block, noise, seed)
        local = np.searchsorted(rest, after)
        return rest[repair_batches(local, sub, batch)[0]]
    chars = objective.matrix(features)
    prefix = chars.take_rows(np.asarray(prefix_rows, dtype=np.int64))
    state = GreedyState(prefix.column_totals().astype(np.float64), float(features.lengths[prefix_rows].sum()), int(len(prefix_rows)))
    picked = greedy_rows(chars.take_rows(rest), features.lengths[rest], chars.targets(features.lengths), state, None, noise, seed)
    return rest[repair_batches(picked, sub, batch)[0]]
