"""Curriculum-aligned targets (TerRIFIC curricula, "Dynamic Schedules: From Fixed Mixtures to Continuous Curricula").

p(N) = softmax(f(N)) with f piecewise linear in log N between user knots and clamped outside;
the cumulative group target is E_j(S) = int_0^S p_j(n) dn and the length target
U*_b(S) = sum_j E_j(S) kappa_{b|j}. The greedy then scores
sum_j [(T_j + c_sj) - E_j(S + l_s)]^2 + lam sum_b [(U_b + l_sb) - U*_b(S + l_s)]^2.

Knots file (JSON or YAML)::

    knots:
      - tokens: 1.0e5            # N at this knot
        logits: {0: 2.0, 3: -1}  # cluster -> logit; unlisted clusters get `default_logit` (0)
      - tokens: 1.0e7
        logits: [0.0, 0.5, ...]  # or a full list of K logits
    default_logit: 0.0           # optional

The integral is evaluated with 16-point Gauss-Legendre in u = log n on each piece between
knots (f is linear in u there, so the integrand is smooth), and E(S) is rescaled so that
sum_j E_j(S) = S exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from pipeline.errors import StrataInputError
from pipeline.heavy import lazy
from pipeline.ordering import families
from pipeline.ordering.features import Csr, SequenceFeatures
from pipeline.ordering.greedy import BLOCK, EXACT_MAX, GreedyState, Objective, greedy_rows, stratified_stream, tie_tolerance

sp = lazy("scipy.sparse")  # imported on first use (pipeline/heavy.py)

_GL_X, _GL_W = np.polynomial.legendre.leggauss(16)


@dataclass(frozen=True)
class Curriculum:
    """Knots (log N_k, logits f_k in R^K) of a piecewise-linear-in-log-N logit schedule."""

    log_tokens: np.ndarray  # (n_knots,) strictly increasing
    logits: np.ndarray  # (n_knots, K)

    def probabilities(self, log_n: np.ndarray) -> np.ndarray:
        """p(N) = softmax(f(N)) at the given log N (clamped outside the knots); (len, K)."""
        u = np.clip(np.atleast_1d(log_n), self.log_tokens[0], self.log_tokens[-1])
        k = np.clip(np.searchsorted(self.log_tokens, u, side="right") - 1, 0, self.log_tokens.size - 2)
        if self.log_tokens.size == 1:
            f = np.repeat(self.logits[:1], u.size, axis=0)
        else:
            x0, x1 = self.log_tokens[k], self.log_tokens[k + 1]
            alpha = ((u - x0) / (x1 - x0))[:, None]
            f = (1.0 - alpha) * self.logits[k] + alpha * self.logits[k + 1]
        f = f - f.max(axis=1, keepdims=True)
        e = np.exp(f)
        return e / e.sum(axis=1, keepdims=True)

    def integral(self, lo: float, hi: float) -> np.ndarray:
        """int_lo^hi p(n) dn for 0 <= lo <= hi, piecewise over the knots."""
        total = np.zeros(self.logits.shape[1])
        n0 = float(np.exp(self.log_tokens[0]))
        if lo < n0:  # below the first knot p is constant
            total += (min(hi, n0) - lo) * self.probabilities(np.array([self.log_tokens[0]]))[0]
            lo = n0
        if hi <= lo:
            return total
        cuts = np.concatenate([[np.log(lo)], self.log_tokens[(self.log_tokens > np.log(lo)) & (self.log_tokens < np.log(hi))],
                               [np.log(hi)]])
        for u0, u1 in zip(cuts[:-1], cuts[1:]):
            u = 0.5 * (u1 - u0) * _GL_X + 0.5 * (u1 + u0)
            total += 0.5 * (u1 - u0) * (_GL_W * np.exp(u)) @ self.probabilities(u)
        return total

    def cumulative(self, s_values: np.ndarray) -> np.ndarray:
        """E(S) for ascending S values: (len, K), each row summing to its S."""
        s_values = np.asarray(s_values, dtype=np.float64)
        out = np.empty((s_values.size, self.logits.shape[1]))
        acc = np.zeros(self.logits.shape[1])
        prev = 0.0
        for i, s in enumerate(s_values):
            acc = acc + self.integral(prev, float(s))
            prev = float(s)
            tot = acc.sum()
            out[i] = acc * (s / tot) if tot > 0 else acc
        return out


def load_curriculum(path: str | Path, n_clusters: int) -> Curriculum:
    """Read a knots file (JSON or YAML, see module docstring) for ``n_clusters`` clusters."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        raw = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise StrataInputError(f"cannot read the curriculum file ({exc})", fix="give a readable JSON or YAML knots file",
                               path=path) from None
    return curriculum_from_dict(raw, n_clusters, path)


def curriculum_from_dict(raw: object, n_clusters: int, path: object = "<curriculum>") -> Curriculum:
    fix = "write {knots: [{tokens: N, logits: {cluster: value} or [K values]}, ...]} with N > 0 increasing"
    if not isinstance(raw, dict) or not isinstance(raw.get("knots"), list) or not raw["knots"]:
        raise StrataInputError("the curriculum has no list of knots", fix=fix, path=path)
    default = float(raw.get("default_logit", 0.0))
    logs, rows = [], []
    for i, knot in enumerate(raw["knots"]):
        if not isinstance(knot, dict) or "tokens" not in knot or "logits" not in knot:
            raise StrataInputError(f"knot {i} lacks `tokens` or `logits`", fix=fix, path=path)
        n = float(knot["tokens"])
        if not n > 0:
            raise StrataInputError(f"knot {i} has tokens={knot['tokens']!r}", fix=fix, path=path)
        f = np.full(n_clusters, default)
        lg = knot["logits"]
        if isinstance(lg, dict):
            for c, val in lg.items():
                c = int(c)
                if not 0 <= c < n_clusters:
                    raise StrataInputError(f"knot {i} names cluster {c}, outside 0..{n_clusters - 1}", fix=fix, path=path)
                f[c] = float(val)
        elif isinstance(lg, list) and len(lg) == n_clusters:
            f[:] = np.asarray(lg, dtype=np.float64)
        else:
            raise StrataInputError(f"knot {i} logits are neither a mapping nor a list of {n_clusters} values", fix=fix, path=path)
        logs.append(np.log(n))
        rows.append(f)
    logs = np.asarray(logs)
    if np.any(np.diff(logs) <= 0):
        raise StrataInputError("knot token counts are not strictly increasing", fix=fix, path=path)
    return Curriculum(logs, np.vstack(rows))


# token families the curriculum has targets for: clusters follow it, length bins its length target U*,
# norm the fixed rho; every sequence family (the registry's) keeps its fixed shares of sequences
CURRICULUM_TOKEN_FAMILIES = ("cluster", "length_bin", "norm")
CURRICULUM_RTOL = 0.002  # largest change of any p_j(N) across one round of the blocked curriculum greedy
MIN_ROUND = 16  # fewest sequences one round picks where the curriculum moves fast or its pool is short
SHORT_TOL = 0.005  # a pool is short of cluster j when the curriculum wants pbar_j > its share + this
CATCH_UP = 1.0  # most of a cluster's lag behind E_j(S), in mean sequence lengths, a round makes up at its start
CATCH_UP_RATE = 1.0  # ... and over its span, as a fraction of the cluster's target rate pbar_j


def _check(features: SequenceFeatures, curriculum: Curriculum, objective: Objective) -> dict[str, float]:
    """The objective's family weights, after checking the curriculum and the families fit."""
    if curriculum.logits.shape[1] != features.clusters.n_cols:
        raise StrataInputError(
            f"the curriculum has {curriculum.logits.shape[1]} clusters, the sequences {features.clusters.n_cols}",
            fix="give one logit per cluster (or a mapping of cluster ids)",
        )
    weights = {f.name: f.weight for f in objective.families}
    other = sorted(f.name for f in objective.families if f.level == "tokens" and f.name not in CURRICULUM_TOKEN_FAMILIES)
    if other or "cluster" not in weights:
        allowed = [*CURRICULUM_TOKEN_FAMILIES, *families.names("sequences")]
        raise StrataInputError(
            f"greedy_curriculum cannot balance the families {other or ['(no cluster family)']}",
            fix=f"use the families {', '.join(allowed)} (any preset)",
        )
    return weights


def curriculum_greedy_order(
    features: SequenceFeatures,
    curriculum: Curriculum,
    objective: Objective,
    noise: float = 0.0,
    seed: int = 0,
    *,
    greedy_exact_max: int = EXACT_MAX,
    greedy_block: int = BLOCK,
) -> np.ndarray:
    """``greedy_curriculum``: the exact curriculum greedy up to ``greedy_exact_max`` sequences
    (:func:`curriculum_exact_order`), the blocked one above (:func:`curriculum_blocked_order`) with
    pools of ``greedy_block`` sequences; rows in order. A pool is one ``greedy`` block so that both cost
    about the same per sequence: a round scans 3/4 of its pool per pick on average, ``greedy``'s deal
    about one block (its pool of 1.5 blocks shrinking to half a block) and its block order half of one."""
    if greedy_exact_max < 0:
        raise StrataInputError(f"greedy_exact_max={greedy_exact_max} is impossible", fix=f"use an integer >= 0 (default {EXACT_MAX})")
    if features.n_sequences <= greedy_exact_max:
        return curriculum_exact_order(features, curriculum, objective, noise, seed)
    return curriculum_blocked_order(features, curriculum, objective, max(2, greedy_block), noise, seed)


class _Targets:
    """E(S) of a curriculum along the stream (S ascending), normalized so sum_j E_j(S) = S as in
    the exact greedy, and its length target U*(S) = E(S) kappa."""

    def __init__(self, curriculum: Curriculum, kappa_cond: np.ndarray):
        self.cur, self.kappa = curriculum, kappa_cond
        self.at, self.acc = 0.0, np.zeros(curriculum.logits.shape[1])  # acc = int_0^at p

    def __call__(self, s: float) -> np.ndarray:
        """E(s); the integral advances from the furthest s asked, so ask in about ascending order."""
        if s >= self.at:
            self.acc = self.acc + self.cur.integral(self.at, s)
            self.at = s
            acc = self.acc
        else:
            acc = self.acc - self.cur.integral(s, self.at)
        tot = acc.sum()
        return acc * (s / tot) if tot > 0 else acc.copy()

    def rate_change(self, lo: float, hi: float) -> float:
        """max_j |p_j(hi) - p_j(lo)|."""
        p = self.cur.probabilities(np.log(np.maximum([lo, hi], 1e-300)))
        return float(np.abs(p[1] - p[0]).max())


def curriculum_blocked_order(
    features: SequenceFeatures,
    curriculum: Curriculum,
    objective: Objective,
    greedy_block: int = BLOCK,
    noise: float = 0.0,
    seed: int = 0,
) -> np.ndarray:
    """Scalable curriculum greedy: rounds of the exact greedy kernel on pools of ``greedy_block`` sequences,
    each against the curriculum's targets over the span it fills; O(M * greedy_block).

    The sequences wait in a ring queue in the order of a stratified shuffle (``stratified_stream``).
    Each round takes the first ``greedy_block`` of them as its pool and runs the exact greedy
    (``greedy_rows``, ``greedy``'s kernel) from the stream's running totals to pick n of them:

    - n = greedy_block / 2, halved (down to 16) until no p_j(N) changes by more than 0.002 across the
      round's span [S, S + n Lbar] (Lbar = mean sequence length);
    - and at most half the pool's share of the cluster the pool is shortest of: when the
      curriculum wants pbar_j > q_j + 0.005 (q_j = cluster j's token share in the pool),
      n <= greedy_block * min_j (q_j / pbar_j) / 2, so the picks can follow the curriculum where it asks
      for several times a cluster's corpus share (without this bound the greedy falls behind on
      that cluster and later catches up in a burst: one batch of 89% one cluster, measured).

    Inside a round the targets are the curriculum's, linearized over the round's span, with the
    stream's lag behind it made up gradually: with D_j = E_j(S) - T_j (T_j the stream's tokens of
    cluster j so far), d_j = clip(D_j, +-Lbar) and r_j = clip(D_j - d_j, +-pbar_j span), cluster
    j's target is T_j + d_j + (pbar_j + r_j / span)(S' - S) (slope floored at 0; pbar the mean of p
    over the span), and U*_b(S') = U*_b(S) + (pbar kappa)_b (S' - S). So a round makes up at most
    one sequence's worth of a cluster's lag at its start and at most doubles the cluster's rate over
    its span: what one pool lacked is made up over the next rounds, not in a run of that cluster as
    soon as a pool holds it (with the exact target E_j(S) the greedy closes the whole lag first: at
    M=10M, K=1,000, a batch of 71% one cluster, measured under load). The picks are appended to
    the schedule and the pool's other sequences go to the back of the queue, so a sequence the
    curriculum does not want now comes back later. The running totals are the whole stream's,
    never reset. The last pool is drained completely.

    Why not ``greedy``'s blocked scheme (blocks dealt first, each ordered from an empty state
    against its own shares): a curriculum block would have to hold the curriculum's increments over
    its span, and packed sequences mix clusters, so no dealing of whole sequences realizes them.
    Nor a queue sorted by when the curriculum wants each sequence's dominant cluster: its pools
    lack the clusters a sequence carries besides its dominant one (measured, M=100k, K=1000: mean
    per-batch deviation from the curriculum 1.6x this scheme's). Noise: round r draws its eps_s
    with seed ``seed + r``.
    """
    if greedy_block < 2:
        raise StrataInputError(f"greedy_block={greedy_block} is too small", fix=f"use pools of at least 2 sequences (default {BLOCK})")
    weights = _check(features, curriculum, objective)
    joint = features.cluster_bin_tokens
    targets = _Targets(curriculum, joint / np.maximum(joint.sum(axis=1, keepdims=True), 1e-300))
    return targets_blocked_order(features, targets, objective, weights, greedy_block, noise, seed)


def targets_blocked_order(features: SequenceFeatures, targets, objective: Objective, weights: dict[str, float],
                          greedy_block: int = BLOCK, noise: float = 0.0, seed: int = 0, drain_in_rounds: bool = False,
                          targeted: str = "cluster") -> np.ndarray:
    """The rounds of :func:`curriculum_blocked_order` against any cumulative targets of the
    ``cluster`` columns: ``targets(S)`` gives E(S) per column of ``features.clusters`` (summing to
    S), ``targets.rate_change(lo, hi)`` the largest change of a target rate across [lo, hi], and
    ``targets.kappa`` the length bins' shares per column (None: the length bins, like every other
    family, keep their shares of ``features``' tokens or sequences); ``targets.kappas`` (optional)
    maps other token families to their shares per column likewise. ``drain_in_rounds``: the last
    pool too is picked in rounds bounded by the rate change (a blend's stage may end inside it).
    ``targeted``: the token family the targets are for (its columns are ``features.clusters``'
    for ``cluster``; a blend targets its groups' family and holds the clusters at their share)."""
    m = features.n_sequences
    chars = objective.matrix(features)
    lengths = np.asarray(features.lengths, dtype=np.float64)
    t_glob = chars.targets(lengths)
    cl = chars.family_columns[targeted]
    lb = chars.family_columns.get("length_bin")
    sc, sl = float(np.sqrt(weights[targeted])), float(np.sqrt(weights.get("length_bin", 0.0)))
    lbar = float(lengths.mean())
    state = GreedyState.empty(chars.n_cols)
    queue = stratified_stream(features, np.random.default_rng(seed))  # a ring: head, count
    head, count = 0, m
    out = np.empty(m, dtype=np.int64)
    done, rnd = 0, 0
    while count:
        size = min(greedy_block, count)
        pool = np.sort(queue[(head + np.arange(size)) % m])
        head, count = (head + size) % m, count - size
        sub = chars.take_rows(pool)
        n_pick = size if count == 0 and not (drain_in_rounds and size > MIN_ROUND) else max(1, size // 2)
        s0 = state.S
        n_pick, span, e0, pbar = _round_rate(targets, n_pick, s0, lbar, sub, lengths[pool], cl, sc, size, count > 0)
        t, off = _round_targets(targets, chars, weights, t_glob, cl, lb, sc, sl, state.X[cl[0] : cl[1]] / sc, e0, pbar, span, s0, lbar)
        state.X -= off
        picked = greedy_rows(sub, lengths[pool], t, state, n_pick, noise, seed + rnd)
        state.X += off
        out[done : done + picked.size] = pool[picked]
        done += picked.size
        rest = np.ones(size, dtype=bool)
        rest[picked] = False
        back = pool[rest]
        queue[(head + count + np.arange(back.size)) % m] = back
        count += back.size
        rnd += 1
    return out


def _round_rate(targets, n_pick: int, s0: float, lbar: float, sub: Csr, pool_lengths: np.ndarray, cl: tuple[int, int], sc: float,
                size: int, pool_left: bool) -> tuple[int, float, np.ndarray, np.ndarray]:
    """``(picks, their span of tokens, E(S) at the round's start, the target rate over the span)``
    of one round of :func:`targets_blocked_order`: ``n_pick`` halved while the target rates change
    by more than :data:`CURRICULUM_RTOL` across the span, and, while sequences remain beyond the
    pool (``pool_left``), at most half of what the pool holds of the cluster the curriculum wants
    most above its pool share."""
    while n_pick > MIN_ROUND and targets.rate_change(s0 + 1.0, s0 + 1.0 + n_pick * lbar) > CURRICULUM_RTOL:
        n_pick //= 2
    span = max(n_pick * lbar, 1.0)
    e0 = targets(s0)
    pbar = (targets(s0 + span) - e0) / span
    if pool_left:  # pick at most half of what the pool holds of the cluster the curriculum wants most above its pool share
        have = sub.column_totals()[cl[0] : cl[1]] / (sc * pool_lengths.sum())
        short = pbar > have + SHORT_TOL
        if short.any():
            n_max = max(MIN_ROUND, int(size * float(np.min(have[short] / pbar[short])) * 0.5))
            if n_pick > n_max:
                n_pick = n_max
                span = max(n_pick * lbar, 1.0)
                pbar = (targets(s0 + span) - e0) / span
    return n_pick, span, e0, pbar


def _round_targets(targets, chars, weights: dict[str, float], t_glob: np.ndarray, cl: tuple[int, int], lb: tuple[int, int] | None,
                   sc: float, sl: float, got: np.ndarray, e0: np.ndarray, pbar: np.ndarray, span: float, s0: float,
                   lbar: float) -> tuple[np.ndarray, np.ndarray]:
    """``(rates t, offsets)`` of one round's linear targets ``t * S + offset`` over every column:
    the targeted clusters' rate ``pbar`` plus their lag behind E(S) (``got``: the stream's tokens
    of each so far), made up partly at the round's start and partly over its span; the length bins
    and the ``kappas`` families at their shares of those targets; every other column at its global
    target ``t_glob``."""
    lag = e0 - got
    first = np.clip(lag, -CATCH_UP * lbar, CATCH_UP * lbar)  # made up at the round's start
    spread = CATCH_UP_RATE * pbar * span  # made up evenly over the round
    slope = np.maximum(pbar + np.clip(lag - first, -spread, spread) / span, 0.0)
    start = got + first
    t = t_glob.copy()
    off = np.zeros_like(t)
    t[cl[0] : cl[1]] = sc * slope
    off[cl[0] : cl[1]] = sc * (start - slope * s0)
    if lb is not None and targets.kappa is not None:
        t[lb[0] : lb[1]] = sl * (pbar @ targets.kappa)
        off[lb[0] : lb[1]] = sl * ((e0 - pbar * s0) @ targets.kappa)
    for name, kappa in getattr(targets, "kappas", {}).items():  # a family held at its share within each target column
        if name in chars.family_columns:
            a, b = chars.family_columns[name]
            sf = float(np.sqrt(weights[name]))
            t[a:b] = sf * (pbar @ kappa)
            off[a:b] = sf * ((e0 - pbar * s0) @ kappa)
    return t, off


def curriculum_batch_deviations(
    features: SequenceFeatures, rows: np.ndarray, curriculum: Curriculum, batch_size: int, chunk: int = 2048
) -> np.ndarray:
    """max_j |share_j(batch) - target_j(batch)| for each full batch of ``batch_size`` sequences of the
    order ``rows``: the target is the curriculum's increment over the batch's tokens,
    (E_j(S_end) - E_j(S_start)) / (S_end - S_start), E normalized as the greedy's."""
    rows = np.asarray(rows, dtype=np.int64)
    n_batches = rows.size // batch_size
    k = features.clusters.n_cols
    ends = np.cumsum(features.lengths[rows].astype(np.float64))
    bounds = np.r_[0.0, ends[batch_size - 1 : n_batches * batch_size : batch_size]]
    c = features.clusters
    out = np.empty(n_batches)
    targets = _Targets(curriculum, np.eye(k))
    prev = targets(bounds[0])
    for lo in range(0, n_batches, chunk):
        hi = min(n_batches, lo + chunk)
        e = np.empty((hi - lo, k))
        for i, s in enumerate(bounds[lo + 1 : hi + 1]):
            cur = targets(float(s))
            e[i] = cur - prev
            prev = cur
        sub = c.take_rows(rows[lo * batch_size : hi * batch_size])
        got = np.zeros((hi - lo, k))
        np.add.at(got, (np.repeat(np.arange(sub.n_rows) // batch_size, np.diff(sub.indptr)), sub.indices), sub.data)
        size = got.sum(axis=1, keepdims=True)
        out[lo:hi] = np.abs(got / size - e / np.maximum(e.sum(axis=1, keepdims=True), 1e-300)).max(axis=1)
    return out

def curriculum_exact_order(
    features: SequenceFeatures, curriculum: Curriculum, objective: Objective, noise: float = 0.0, seed: int = 0
) -> np.ndarray:
    """Exact greedy with curriculum targets E_j(S + l_s) and U*_b(S + l_s) (TerRIFIC curricula); rows in order.

    ``objective``'s ``cluster`` family follows the curriculum, its ``length_bin`` family (weight lam)
    the curriculum's length target, its ``norm`` family the fixed rho and its sequence families
    (``concentration``, ``documents``, ``cluster_count``, any of the registry's) their fixed shares
    of sequences, as in ``greedy``; other token families (documents columns) have no curriculum
    target and are refused. The targets move for every cluster at every
    step, so there is no sparse update: each step scores all remaining sequences with one sparse
    mat-vec per distinct sequence length, O(M * nnz) per step (16 CPU s at M=20k, K=1000:
    ``benchmarks/bench_order.py --curriculum``); above ``greedy_exact_max`` sequences
    ``curriculum_greedy_order`` runs :func:`curriculum_blocked_order` instead. Ties and noise
    follow ``greedy`` (lowest row within ``tie_tolerance``; sigma in units of Lbar^2).
    """
    weights = _check(features, curriculum, objective)
    wc, lam, wn = weights["cluster"], weights.get("length_bin", 0.0), weights.get("norm", 0.0)
    seq_fams = Objective(tuple(f for f in objective.families if f.level == "sequences"))
    m = features.n_sequences
    mats = _cluster_bin_matrices(features)
    c, bm, _, c2, _ = mats
    lengths = features.lengths
    norms = np.sqrt(c2)
    rho = norms.sum() / lengths.sum()
    N = 0.0
    if seq_fams.families:
        xs, t_seq, unit, a_seq, Xs = _sequence_family_terms(seq_fams, features, lengths)
    tol = tie_tolerance(max(lengths.max(), lengths.mean()), objective.total_weight)
    sigma = float(noise) * float(lengths.mean()) ** 2
    rng = np.random.default_rng(seed)
    T = np.zeros(c.shape[1])
    U = np.zeros(bm.shape[1])
    S = 0.0
    acc = np.zeros(c.shape[1])  # unnormalized int_0^S p
    live = np.ones(m, dtype=bool)
    out = np.empty(m, dtype=np.int64)
    score = np.empty(m)
    for step in range(m):
        _score_by_length(score, live, lengths, curriculum, acc, S, T, U, mats, wc, lam)
        if seq_fams.families:
            score += a_seq + 2.0 * (xs @ (Xs - t_seq * unit * step))
        if wn:
            score += wn * (N + norms - rho * (S + lengths)) ** 2
        score[~live] = np.inf
        if sigma > 0:
            score[live] += sigma * rng.standard_normal(int(live.sum()))
        r = int(np.flatnonzero(score <= score.min() + tol)[0])
        out[step] = r
        live[r] = False
        _add_row(c, r, T)
        _add_row(bm, r, U)
        if seq_fams.families:
            _add_row(xs, r, Xs)
        acc = acc + curriculum.integral(S, S + lengths[r])
        S += lengths[r]
        N += norms[r]
    return out


def _cluster_bin_matrices(features: SequenceFeatures):
    """``(clusters, length bins, each cluster's length-bin shares, squared row norms of both)``:
    the sparse tokens per sequence the exact curriculum greedy scores, and the shares that turn a
    cluster target into a length-bin target."""
    m = features.n_sequences
    c = _scipy_csr(features.clusters, m)
    bm = _scipy_csr(features.bins, m)
    joint = features.cluster_bin_tokens
    kappa_cond = joint / np.maximum(joint.sum(axis=1, keepdims=True), 1e-300)
    c2 = np.asarray(c.multiply(c).sum(axis=1)).ravel()
    b2 = np.asarray(bm.multiply(bm).sum(axis=1)).ravel()
    return c, bm, kappa_cond, c2, b2


def _sequence_family_terms(seq_fams: Objective, features: SequenceFeatures, lengths: np.ndarray):
    """The sequence families' part of the exact greedy's scores: ``(their matrix, targets, unit,
    each row's constant term, the stream's running sum (zeros))``."""
    chars = seq_fams.matrix(features)
    xs, t_seq, unit = _scipy_csr(chars.x, features.n_sequences), chars.targets(lengths), chars.unit
    a_seq = np.asarray(xs.multiply(xs).sum(axis=1)).ravel() - 2.0 * unit * (xs @ t_seq) + unit**2 * (t_seq @ t_seq)
    return xs, t_seq, unit, a_seq, np.zeros(xs.shape[1])


def _score_by_length(score: np.ndarray, live: np.ndarray, lengths: np.ndarray, curriculum: Curriculum, acc: np.ndarray, S: float,
                     T: np.ndarray, U: np.ndarray, mats: tuple, wc: float, lam: float) -> None:
    """Each live sequence's cluster and length-bin terms of the exact curriculum greedy's score,
    into ``score``: the curriculum's targets E(S + l) are the same for every sequence of length l,
    so one sparse mat-vec per distinct length scores them all."""
    c, bm, kappa_cond, c2, b2 = mats
    for length in np.unique(lengths[live]):
        e = acc + curriculum.integral(S, S + length)
        e *= (S + length) / e.sum()
        dc = T - e
        db = U - e @ kappa_cond
        sel = live & (lengths == length)
        sc = wc * (c2 + 2.0 * (c @ dc) + dc @ dc) + lam * (b2 + 2.0 * (bm @ db) + db @ db)
        score[sel] = sc[sel]


def _add_row(x: sp.csr_matrix, r: int, into: np.ndarray) -> None:
    """Add row ``r`` of ``x`` to the dense running sum ``into`` (in place)."""
    lo, hi = x.indptr[r], x.indptr[r + 1]
    into[x.indices[lo:hi]] += x.data[lo:hi]


def _scipy_csr(x: Csr, m: int) -> sp.csr_matrix:
    return sp.csr_matrix((x.data, x.indices, x.indptr), shape=(m, x.n_cols))
