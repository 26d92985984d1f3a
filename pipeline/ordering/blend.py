"""Blends: token weights over the groups of any documents column, by stage, realized and ordered.

A *blend* (``mixture.weights`` or ``mixture.stages``, docs/mixture.md "Blends") gives each group of
a documents column (``mixture.column``: ``source`` by default; a numeric column cut into
``mixture.bins`` token quantiles) a share of the schedule's tokens, piecewise constant by tokens:
stage k holds weights w_k from ``until_tokens`` of stage k-1 to its own (fractions of the schedule;
a stage's linear ramp from the previous weights is realized as constant steps: :func:`ramp_stages`).
``greedy_blend`` realizes it in three steps:

1. **Counts.** Every packed sequence s is used r_s times so that the schedule's tokens of group g
   are sum_k w_kg B_k (B_k the stage's tokens): ``greedy_mixture``'s solver
   (``pipeline.ordering.schedule.repeat_counts``) on the sequences' group tokens instead of their
   clusters, each sequence capped by the group it mostly holds: ceil(``max_repetition``) copies,
   and none for the sequences beyond ``max_fraction`` of the group's distinct tokens (a seeded
   subsample). The budget B (``mixture_budget_tokens``, 0 = the packing's tokens) is lowered until
   every group's tokens fit its caps, so the weights come before the budget.
2. **Order.** The blocked curriculum greedy's rounds (``pipeline.ordering.curriculum``) with the
   blend's cumulative targets E_g(S) = sum over the stages of w_kg x (their tokens below S): the
   stream tracks the blend at every prefix, and every family the blend does not target (clusters,
   length bins, the kind of sequence) is held at its share of the schedule in every window, as
   ``greedy`` holds it.
3. **Accounting.** :func:`blend_accounting` measures each stage's realized group shares on the
   written order (a sequence belongs to the stage its first token falls in), and
   :func:`document_uses` each document piece's planned uses (the counts of step 1, solved again
   from the same inputs) against its realized uses (its sequence's occurrences in the order).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.heavy import lazy
from pipeline.ordering.characteristics import Family
from pipeline.ordering.curriculum import targets_blocked_order
from pipeline.ordering.features import Csr, SequenceFeatures
from pipeline.ordering.greedy import Objective
from pipeline.ordering.schedule import round_counts, solve_rates

sparse = lazy("scipy.sparse")  # imported on first use (pipeline/heavy.py)

GROUP_FAMILY = "blend_group"  # the objective's family of the blend's groups (features.columns)
GROUP_WEIGHT = 4.0  # the groups' family weighs this many times all other families together: the blend first
BLEND_SCHEMA = {"stage": pl.Int64, "group": pl.String, "start_tokens": pl.Int64, "end_tokens": pl.Int64,
                "target_share": pl.Float64, "realized_share": pl.Float64, "realized_tokens": pl.Int64, "corpus_tokens": pl.Int64,
                "scheduled_tokens": pl.Int64, "repetition": pl.Float64, "max_repetition": pl.Float64, "distinct_fraction": pl.Float64,
                "max_fraction": pl.Float64}


@dataclass(frozen=True)
class Blend:
    """A blend as configured: the column, its binning, and per stage its end (fraction of the
    schedule's tokens) and weights by group name; caps by group name."""

    column: str
    bins: int
    ends: tuple[float, ...]
    weights: tuple[tuple[tuple[str, float], ...], ...]  # per stage: (group, weight) pairs
    max_repetition: tuple[tuple[str, float], ...] = ()
    max_fraction: tuple[tuple[str, float], ...] = ()
    on_infeasible: str = "shrink"  # the caps cannot give the weights at the budget: shrink it (warned) | error
    origin: tuple[int, ...] = ()  # with ramps: per stage, the configured stage it comes from (a ramp's steps: that stage's)
    # the column's groups (document_groups' names), given where the documents are not at hand (a part's worker);
    # not part of what the blend is (its repr, recorded in the lineage, and equality leave it out)
    groups: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @staticmethod
    def from_config(mixture) -> "Blend | None":
        """The blend of a ``MixtureConfig`` (``mixture.weights`` or ``mixture.stages``), None without
        one; a stage's ramp (``ramp_tokens``) becomes ``mixture.ramp_steps`` stages of their own
        (:func:`ramp_stages`)."""
        if mixture.stages:
            stages = ramp_stages([(s.until_tokens, s.ramp_tokens, s.weights) for s in mixture.stages], mixture.ramp_steps)
        elif mixture.weights:
            stages = [(1.0, mixture.weights, 0)]
        else:
            return None

        def pairs(d: dict) -> tuple:
            return tuple(sorted((str(k), float(v)) for k, v in d.items()))

        return Blend(mixture.column, mixture.bins, tuple(float(e) for e, _, _ in stages), tuple(pairs(w) for _, w, _ in stages),
                     pairs(mixture.max_repetition), pairs(mixture.max_fraction), mixture.on_infeasible,
                     tuple(k for _, _, k in stages) if len(stages) > len(mixture.stages or [1]) else ())

    def key(self, i: int) -> str:
        """The config key of stage i's weights (for error messages)."""
        configured = self.origin[i] if self.origin else i
        return f"mixture.stages[{configured}].weights" if len(self.ends) > 1 or self.ends != (1.0,) else "mixture.weights"

    def matrix(self, names: list[str]) -> np.ndarray:
        """(stages x groups) weights, each row normalized; names the blend gives that the column lacks are errors."""
        out = np.zeros((len(self.ends), len(names)))
        for i, stage in enumerate(self.weights):
            for name, w in stage:
                if name not in names:
                    raise StrataInputError(f"{self.key(i)} names the group {name!r}, which the column {self.column!r} does not hold",
                                           fix=f"name groups among {names} (mixture.column: {self.column}"
                                               f"{'' if not self.bins else f', binned into {self.bins}'})")
                out[i, names.index(name)] = w
            if not out[i].sum() > 0:
                raise StrataInputError(f"{self.key(i)} gives every group of this corpus weight 0",
                                       fix=f"give a group among {names} a weight > 0")
            out[i] /= out[i].sum()
        return out

    def caps(self, names: list[str], what: str, default: float) -> np.ndarray:
        given = dict(self.max_repetition if what == "max_repetition" else self.max_fraction)
        for name in given:
            if name not in names:
                raise StrataInputError(f"mixture.{what} names the group {name!r}, which the column {self.column!r} does not hold",
                                       fix=f"name groups among {names}")
        return np.array([given.get(n, default) for n in names])


def ramp_stages(stages: list[tuple[float, float, dict]], steps: int) -> list[tuple[float, dict, int]]:
    """(end, weights, configured stage) of each stage the blend realizes, from the configured
    (``until_tokens``, ``ramp_tokens``, weights): a stage with a ramp of r tokens (a fraction of
    the schedule) starting at the previous stage's end a first moves linearly from the previous
    stage's weights to its own, as ``steps`` constant stages of r / steps each whose weights are
    the line's at the step's middle (its mean over the step: each step's group tokens are the
    linear ramp's, so the cumulative targets are the ramp's at every step's end), then holds its
    own weights to its end. A ramp's weights are interpolated between shares (each stage's weights
    normalized first); a stage without one keeps its weights as configured."""
    out: list[tuple[float, dict, int]] = []
    start, before = 0.0, None
    for k, (end, ramp, weights) in enumerate(stages):
        total = float(sum(weights.values()))
        share = {str(g): float(w) / total for g, w in weights.items()}
        if ramp > 0 and before is not None:
            names = sorted(set(before) | set(share))
            for j in range(steps):
                t, stop = (j + 0.5) / steps, start + ramp * (j + 1) / steps
                out.append((float(end) if abs(stop - end) <= 1e-9 else stop,
                            {g: (1 - t) * before.get(g, 0.0) + t * share.get(g, 0.0) for g in names}, k))
        if not out or end > out[-1][0]:
            out.append((float(end), weights, k))  # as configured (normalized where the blend is read)
        start, before = float(end), share
    return out


def document_groups(docs: pl.DataFrame, blend: Blend) -> tuple[np.ndarray, list[str]]:
    """Per document row of ``docs`` its group (0..G-1) and the group names: the column's values in
    sorted order, or for ``mixture.bins`` n >= 2 the n token quantiles of a numeric column ("0" the lowest)."""
    col = blend.column
    if col not in docs.columns:
        raise StrataInputError(f"mixture.column names {col!r}, which is no column of the documents",
                               fix=f"set mixture.column to one of {sorted(c for c in docs.columns if c != 'doc_id')}")
    values = docs[col]
    if values.null_count():
        raise StrataInputError(f"the documents column {col!r} (mixture.column) has missing values",
                               fix="fill them in the corpus, or set mixture.column to a complete column")
    if not blend.bins:
        names = sorted(values.cast(pl.String).unique().to_list())
        return values.cast(pl.String).rank("dense").to_numpy().astype(np.int64) - 1, names
    if not values.dtype.is_numeric():
        raise StrataInputError(f"mixture.bins={blend.bins} cuts the column {col!r} into quantiles, but it is {values.dtype}",
                               fix="set mixture.bins: 0 for a categorical column, or name a numeric column")
    v = values.cast(pl.Float64).to_numpy()
    tokens = docs["n_tokens"].to_numpy().astype(np.float64)
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(tokens[order]) / max(tokens.sum(), 1.0)
    group = np.empty(v.size, dtype=np.int64)
    group[order] = np.minimum((cum - tokens[order] / max(tokens.sum(), 1.0) / 2) * blend.bins, blend.bins - 1).astype(np.int64)
    return group, [str(b) for b in range(blend.bins)]


def group_tokens(seq_rows: np.ndarray, doc_group: np.ndarray, tokens: np.ndarray, n_rows: int, n_groups: int) -> Csr:
    """(rows x groups) tokens from segment rows (row of each segment, its document's group, its tokens)."""
    dense = np.bincount(seq_rows * n_groups + doc_group, weights=tokens, minlength=n_rows * n_groups).reshape(n_rows, n_groups)
    r, g = np.nonzero(dense)
    return Csr(np.searchsorted(r, np.arange(n_rows + 1)), g.astype(np.int64), dense[r, g], n_groups)


class StageTargets:
    """E(S) of a piecewise-constant blend: stage k's weights between its start and end tokens (the
    last stage continues past its end); the interface of the curriculum's targets."""

    kappa = None  # the length bins are in ``kappas``

    def __init__(self, ends_tokens: np.ndarray, weights: np.ndarray, kappas: dict[str, np.ndarray] | None = None):
        self.ends, self.w = np.asarray(ends_tokens, dtype=np.float64), weights
        self.starts = np.r_[0.0, self.ends[:-1]]
        self.kappas = kappas or {}  # family -> (groups x its columns) shares within each group

    def rate(self, s: float) -> np.ndarray:
        return self.w[min(int(np.searchsorted(self.ends, s, side="right")), len(self.ends) - 1)]

    def __call__(self, s: float) -> np.ndarray:
        inside = np.clip(s - self.starts, 0.0, np.r_[self.ends[:-1] - self.starts[:-1], np.inf])
        return inside @ self.w

    def rate_change(self, lo: float, hi: float) -> float:
        k0, k1 = (min(int(np.searchsorted(self.ends, x, side="right")), len(self.ends) - 1) for x in (lo, hi))
        return float(max(np.abs(self.w[k] - self.w[k0]).max() for k in range(k0, k1 + 1)))


@dataclass(frozen=True)
class BudgetFit:
    """The schedule's size against the budget asked: ``asked`` tokens (``mixture_budget_tokens``, 0 =
    the packing's), ``allowed`` the largest schedule (tokens, to within one sequence) whose group
    tokens meet the weights within every cap, ``binding`` the group whose caps stop it there (""
    when the budget asked fits), ``corpus`` the packing's tokens."""

    asked: float
    allowed: float
    binding: str
    corpus: float

    def warning(self, blend: "Blend") -> str:
        """What a shrunk schedule tells the user ("" when the budget asked fits)."""
        if not self.binding:
            return ""
        rep, frac = dict(blend.max_repetition).get(self.binding, 1.0), dict(blend.max_fraction).get(self.binding, 1.0)
        return (f"the caps allow {self.allowed:,.0f} of the {self.asked:,.0f} tokens asked ({self.allowed / max(self.corpus, 1.0):.1%} "
                f"of the corpus's {self.corpus:,.0f}): the group {self.binding!r} binds (max_repetition {rep:g}, max_fraction {frac:g})")


FEASIBLE = 1e-7  # a budget is met when the rates' group tokens are off the wanted ones by at most this fraction of them


def fit_budget(features: SequenceFeatures, groups: Csr, want, asked: float, hi: float, lo: float, cap: np.ndarray,
               names: list[str], bound: str) -> tuple[BudgetFit, np.ndarray]:
    """``(the fit, the continuous copies r_s at its size)``: the largest size T in [lo, hi] (tokens;
    ``hi`` what every group's total cap allows, ``bound`` the group setting it) for which copies
    0 <= r_s <= ``cap``_s give each group the tokens ``want(T)`` (its weights' share of T - lo),
    by bisection down to one sequence's tokens (what the rows can give grows with T, so the
    largest one that fits is where it stops fitting). The group that stops it: the one furthest
    short of ``want`` just above it."""
    C = sparse.csr_matrix((groups.data, groups.indices, groups.indptr), shape=(groups.n_rows, groups.n_cols))
    inv_l = 1.0 / np.maximum(features.lengths.astype(np.float64), 1.0)

    def rates(t: float) -> tuple[bool, np.ndarray, np.ndarray]:
        need = want(t)
        r = solve_rates(C, inv_l, need, cap)
        got = C.T @ r
        return bool(np.abs(got - need).sum() <= FEASIBLE * max(need.sum(), 1.0)), r, got

    corpus = float(features.lengths.sum())
    ok, r, _ = rates(hi)
    if ok:
        return BudgetFit(asked, hi, bound if hi < asked - 0.5 else "", corpus), r
    short = hi
    step = max(float(features.lengths.min()), 1.0)
    r = np.zeros(features.n_sequences)
    while short - lo > step:
        mid = (lo + short) / 2
        ok, r_mid, got = rates(mid)
        lo, short, r = (mid, short, r_mid) if ok else (lo, mid, r)
    need = want(short)
    _, _, got = rates(short)
    binding = names[int(np.argmax((need - got) / np.maximum(need, 1e-300)))]
    return BudgetFit(asked, lo, binding, corpus), r


def planned_counts(features: SequenceFeatures, groups: Csr, blend: Blend, names: list[str], budget: float,
                   max_sequence_copies: int, seed: int) -> tuple[np.ndarray, np.ndarray, BudgetFit]:
    """Step 1 of the module docstring: the copies r_s of every row, the (stages x groups) weights and
    the schedule's size against ``budget`` (:class:`BudgetFit`; ``mixture.on_infeasible: error``
    stops where the caps cannot give the weights at ``budget``)."""
    w = blend.matrix(names)
    share = np.diff(np.r_[0.0, blend.ends]) @ w  # each group's share of the whole schedule
    corpus = groups.column_totals()
    max_rep, max_frac = blend.caps(names, "max_repetition", 1.0), blend.caps(names, "max_fraction", 1.0)
    if ((share > 0) & (corpus <= 0)).any():
        raise StrataInputError("the blend gives weight to a group this corpus holds no tokens of",
                               fix=f"give weight to groups among {[n for n, c in zip(names, corpus) if c > 0]}")
    fits = np.where(share > 0, max_rep * max_frac * corpus / np.maximum(share, 1e-300), np.inf)
    cap = np.minimum(row_caps(features, groups, max_rep, max_frac, max_sequence_copies, seed), int(max_sequence_copies))
    fit, r = fit_budget(features, groups, lambda t: share * t, float(budget), float(min(budget, fits.min())), 0.0, cap, names,
                        names[int(np.argmin(fits))])
    _infeasible(blend, fit)
    counts = round_counts(replace(features, clusters=groups), r, cap, seed)
    return balance_counts(groups, counts, cap, share, total=fit.allowed), w, fit


def _infeasible(blend: Blend, fit: BudgetFit) -> None:
    """``mixture.on_infeasible: error``: the shrunk schedule is an error naming the binding group."""
    if fit.binding and blend.on_infeasible == "error":
        raise StrataInputError(f"the blend cannot be met at the budget asked: {fit.warning(blend)}",
                               fix=f"set mixture_budget_tokens <= {int(fit.allowed):,}, raise mixture.max_repetition of "
                                   f"{fit.binding!r} (or max_sequence_copies), lower its weight, or set mixture.on_infeasible: shrink")


def row_caps(features: SequenceFeatures, groups: Csr, max_rep: np.ndarray, max_frac: np.ndarray, max_sequence_copies: int,
             seed: int, used: np.ndarray | None = None) -> np.ndarray:
    """Uses each row may have in the whole schedule, held per document piece: the least
    ceil(``max_repetition``) among the groups it holds tokens of (a piece is never used more often
    than its own group allows, whichever group fills the rest of its sequence), at most
    ``max_sequence_copies``; and 0 for the rows beyond ``max_fraction`` of a group's distinct tokens:
    a seeded subsample of the rows holding the group (the rows ``used`` > 0, a frozen prefix's,
    first) keeps at most that fraction of the group's tokens."""
    rows = np.repeat(np.arange(groups.n_rows), np.diff(groups.indptr))
    piece = np.minimum(int(max_sequence_copies), np.ceil(max_rep - 1e-9)).astype(np.int64)
    cap = np.full(groups.n_rows, int(max_sequence_copies), dtype=np.int64)
    np.minimum.at(cap, rows, piece[groups.indices])
    rng = np.random.default_rng(seed)
    for g in np.flatnonzero(max_frac < 1.0):  # a seeded subsample of the rows holding the group keeps its max_fraction
        at = groups.indices == g
        holding, tokens = rows[at], groups.data[at]
        perm = rng.permutation(holding.size)
        holding, tokens = holding[perm], tokens[perm]
        if used is not None:  # the rows a frozen prefix already used stay in the subsample
            first = np.argsort(used[holding] == 0, kind="stable")
            holding, tokens = holding[first], tokens[first]
        kept = np.cumsum(tokens) <= max_frac[g] * tokens.sum() + 1e-9
        cap[holding[~kept]] = 0
    return cap


def piece_caps(blend: "Blend", names: list[str], max_sequence_copies: int) -> dict[str, int]:
    """Each group's cap on the uses of one of its document pieces: ceil(``max_repetition``), at most ``max_sequence_copies``."""
    rep = blend.caps(names, "max_repetition", 1.0)
    return {n: int(min(max_sequence_copies, np.ceil(r - 1e-9))) for n, r in zip(names, rep)}


@dataclass(frozen=True)
class FrozenPlan:
    """A blend's plan after a frozen prefix, per row of the packing: its uses in the prefix, its
    planned uses after it, and its cap on all uses; the (stages x groups) weights and the prefix's tokens."""

    prefix: np.ndarray
    suffix: np.ndarray
    cap: np.ndarray
    weights: np.ndarray
    prefix_tokens: float
    fit: BudgetFit | None = None  # the whole schedule's size against the budget asked


def suffix_need(blend_ends: tuple[float, ...], weights: np.ndarray, prefix_tokens: float, total: float) -> np.ndarray:
    """Each group's tokens the stages ask for between the prefix's end and ``total`` (stage k from
    ``ends[k-1]`` x total to ``ends[k]`` x total, as fractions of the whole schedule)."""
    ends = np.asarray(blend_ends, dtype=np.float64) * total
    starts = np.r_[0.0, ends[:-1]]
    ends[-1] = max(ends[-1], total)
    overlap = np.maximum(np.minimum(ends, total) - np.maximum(starts, prefix_tokens), 0.0)
    return overlap @ weights


def planned_after(features: SequenceFeatures, groups: Csr, blend: Blend, names: list[str], budget: float,
                  max_sequence_copies: int, seed: int, prefix_rows: np.ndarray) -> FrozenPlan:
    """The plan of a blend continuing a frozen prefix (rows of ``features``, repeating): the
    schedule is the prefix followed by copies of the rows chosen as in :func:`planned_counts`,
    the stages (fractions of the whole schedule's tokens) asked of the tokens after the prefix
    alone, each group's caps lowered by what the prefix used of it, each row's copies by its
    uses in the prefix. The whole schedule's tokens T <= ``budget`` are the most for which every
    group fits its remaining caps (bisection: a group's need grows with T)."""
    w = blend.matrix(names)
    n = features.n_sequences
    used = np.bincount(np.asarray(prefix_rows, dtype=np.int64), minlength=n)
    lengths = features.lengths.astype(np.float64)
    t_p = float(lengths @ used)
    max_rep, max_frac = blend.caps(names, "max_repetition", 1.0), blend.caps(names, "max_fraction", 1.0)
    dense = np.zeros((n, groups.n_cols))
    dense[np.repeat(np.arange(n), np.diff(groups.indptr)), groups.indices] = groups.data
    room = max_rep * max_frac * groups.column_totals() - used @ dense + 1e-6  # tokens each group may still give
    cap = row_caps(features, groups, max_rep, max_frac, max_sequence_copies, seed, used)
    total, bound = max(float(budget), t_p), ""
    if (suffix_need(blend.ends, w, t_p, total) > room).any():
        lo, hi = t_p, total
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if (suffix_need(blend.ends, w, t_p, mid) <= room).all() else (lo, mid)
        total, bound = lo, names[int(np.argmax(suffix_need(blend.ends, w, t_p, hi) - room))]
    rest = np.minimum(cap - np.minimum(cap, used), int(max_sequence_copies))
    fit, r = fit_budget(features, groups, lambda t: suffix_need(blend.ends, w, t_p, t), max(float(budget), t_p), total, t_p, rest,
                        names, bound)
    _infeasible(blend, fit)
    suffix = np.zeros(n, dtype=np.int64)
    need = suffix_need(blend.ends, w, t_p, fit.allowed)
    if fit.allowed - t_p >= 1.0 and rest.any() and need.sum() > 0:
        share = need / need.sum()
        suffix = balance_counts(groups, round_counts(replace(features, clusters=groups), r, rest, seed), rest, share,
                                total=fit.allowed - t_p)
    return FrozenPlan(used, suffix, cap, w, t_p, fit)


def balance_counts(groups: Csr, counts: np.ndarray, cap: np.ndarray, share: np.ndarray, steps_per_group: int = 20,
                   total: float | None = None) -> np.ndarray:
    """The rounded copies nudged one copy at a time towards the groups' tokens: ``share`` x
    ``total`` (or, without a total, x their own total): each step adds or removes the one copy
    (within 0..cap) that most lowers the squared distance of the group tokens from it, until none
    does. Rounding mixed sequences leaves the totals a few sequences off, and a last stage of
    10-30% of the tokens takes the whole error (the demo domains of tests/test_blend.py, seeds
    0-7: the last 30%'s L1 up to 0.067 without this step, at most 0.028 with it); with ``total``
    the schedule's size too comes within a sequence of the one planned."""
    counts = counts.astype(np.int64).copy()
    c = sparse.csr_matrix((groups.data, groups.indices, groups.indptr), shape=(groups.n_rows, groups.n_cols))
    sq = np.asarray(c.multiply(c).sum(axis=1)).ravel()
    size = np.asarray(c.sum(axis=1)).ravel()
    got = c.T @ counts
    fixed = total is not None
    for _ in range(steps_per_group * groups.n_cols + (int(size.size) if fixed else 0)):
        d = got - share * (total if fixed else got.sum())  # excess tokens of each group
        # adding row s changes the excess by c_s - share l_s (by c_s with a fixed total): the squared norm by 2 d.(that) + |that|^2
        proj = c @ d - (0.0 if fixed else size * float(share @ d))
        own = sq if fixed else sq - 2.0 * size * (c @ share) + size**2 * float(share @ share)
        add = np.where(counts < cap, 2.0 * proj + own, np.inf)
        drop = np.where(counts > 0, -2.0 * proj + own, np.inf)
        i, j = int(np.argmin(add)), int(np.argmin(drop))
        if min(add[i], drop[j]) >= -1e-9:
            break
        s, step = (i, 1) if add[i] <= drop[j] else (j, -1)
        counts[s] += step
        got = got + step * (c[s].toarray().ravel())
    return counts


def blend_order(features: SequenceFeatures, groups: Csr, counts: np.ndarray, weights: np.ndarray, ends: tuple[float, ...],
                objective, greedy_block: int, noise: float, seed: int, prefix_tokens: float = 0.0) -> np.ndarray:
    """Step 2: the rows of the schedule (row s ``counts[s]`` times) in order, stage by stage: each
    stage's copies are chosen first (:func:`stage_counts`), so every stage holds its own weights
    and no stretch of the stream is what the earlier stages left; then each stage is ordered by
    the greedy against its constant weights. After a frozen prefix of ``prefix_tokens`` tokens the
    stages' ends stay fractions of the whole schedule (prefix included) and the stages are counted
    from the prefix's end: what the prefix realized (under an earlier mix) is not made up for."""
    if not counts.sum():
        raise StrataInputError("the blend schedules no sequence", fix="raise mixture_budget_tokens (0 = the corpus's tokens)")
    lengths = features.lengths.astype(np.float64)
    total = float(counts @ lengths)
    stage_ends = np.maximum(np.asarray(ends) * (total + prefix_tokens) - prefix_tokens, 0.0)
    per_stage = stage_counts(features, groups, counts, weights, np.diff(np.r_[0.0, stage_ends]), seed)
    rows_all = np.repeat(np.arange(features.n_sequences, dtype=np.int64), counts)
    sched_groups = groups.take_rows(rows_all)
    kappas = {"cluster": within_groups(sched_groups, features.clusters.take_rows(rows_all), lengths[rows_all]),
              "length_bin": within_groups(sched_groups, features.bins.take_rows(rows_all), lengths[rows_all])}
    obj = blend_objective(objective)
    weights_by = {f.name: f.weight for f in obj.families}
    out = []
    for k in range(len(ends)):
        rows = np.repeat(np.arange(features.n_sequences, dtype=np.int64), per_stage[k])
        if not rows.size:
            continue
        sched = features.take_rows(rows)
        sched = replace(sched, columns={**sched.columns, GROUP_FAMILY: groups.take_rows(rows)})
        targets = StageTargets(np.array([np.inf]), weights[k : k + 1], kappas)
        order = targets_blocked_order(sched, targets, obj, weights_by, greedy_block, noise, seed + k, drain_in_rounds=True,
                                      targeted=GROUP_FAMILY)
        out.append(rows[order])
    return np.concatenate(out)


def blend_objective(objective: Objective) -> Objective:
    """The objective a blend is ordered (and its parts dealt) by: the groups' family first, weighing
    ``GROUP_WEIGHT`` times all the others together, then the others as configured."""
    others = tuple(f for f in objective.families if f.name != GROUP_FAMILY)
    return Objective((Family(GROUP_FAMILY, GROUP_WEIGHT * sum(f.weight for f in others)), *others))


def stage_counts(features: SequenceFeatures, groups: Csr, counts: np.ndarray, weights: np.ndarray, stage_tokens: np.ndarray,
                 seed: int) -> np.ndarray:
    """(stages x rows) copies: the schedule's ``counts`` dealt to the stages so that stage k holds
    about ``stage_tokens[k]`` tokens with group tokens ``weights[k]`` x those, stage by stage: the
    copies of least squared repetition that give its group tokens (the rates of step 1 on the
    copies not yet dealt), rounded and balanced as in step 1; the last stage takes the rest. As
    the counts hold every stage's group tokens, the rest is the last stage's own mix."""
    out = np.zeros((len(stage_tokens), counts.size), dtype=np.int64)
    left = counts.astype(np.int64).copy()
    C = sparse.csr_matrix((groups.data, groups.indices, groups.indptr), shape=(groups.n_rows, groups.n_cols))
    inv_l = 1.0 / np.maximum(features.lengths.astype(np.float64), 1.0)
    for k, tokens in enumerate(stage_tokens[:-1]):
        if tokens <= 0 or not left.any():
            continue
        r = solve_rates(C, inv_l, weights[k] * tokens, left)
        take = round_counts(replace(features, clusters=groups), r, left, seed + k)
        out[k] = balance_counts(groups, take, left, weights[k], total=float(tokens))
        left -= out[k]
    out[-1] = left
    return out


def within_groups(groups: Csr, other: Csr, lengths: np.ndarray) -> np.ndarray:
    """(groups x columns of ``other``) shares of each group's tokens in ``other``'s columns over the
    schedule, a sequence's tokens of column j split among its groups by their shares of it: the
    clusters and length bins are held at their share *within each group*, so a stage that wants
    more of a group also gets that group's own clusters and lengths, and every window is
    stationary in all else."""
    g = sparse.csr_matrix((groups.data, groups.indices, groups.indptr), shape=(groups.n_rows, groups.n_cols))
    o = sparse.csr_matrix((other.data, other.indices, other.indptr), shape=(other.n_rows, other.n_cols))
    joint = (g.T @ sparse.diags(1.0 / np.maximum(lengths, 1e-300)) @ o).toarray()
    return joint / np.maximum(joint.sum(axis=1, keepdims=True), 1e-300)


def stage_of(order_lengths: np.ndarray, ends: tuple[float, ...]) -> np.ndarray:
    """The stage of each position: where its first token falls among the stages' ends (fractions of the tokens)."""
    start = np.r_[0.0, np.cumsum(order_lengths, dtype=np.float64)[:-1]]
    return np.minimum(np.searchsorted(np.asarray(ends) * float(np.sum(order_lengths)), start, side="right"), len(ends) - 1)


def blend_accounting(order: np.ndarray, seq_group_tokens: np.ndarray, weights: np.ndarray, ends: tuple[float, ...], names: list[str],
                     max_rep: np.ndarray, max_frac: np.ndarray, frozen: int = 0) -> pl.DataFrame:
    """Per stage and group: target and realized token shares of the written order, and per group
    its repetition (scheduled / corpus tokens) and the fraction of its distinct tokens used.
    ``seq_group_tokens``: (sequences x groups) tokens of the packing the order's ids index. With
    a ``frozen`` prefix (its positions), the stages' realized shares are those of the positions
    after it (the prefix was realized under the mix it was consumed with); column
    ``frozen_tokens`` holds each stage's and group's tokens inside the prefix."""
    tokens = seq_group_tokens[order]
    stage = stage_of(tokens.sum(axis=1), ends)
    if frozen:
        inside = np.zeros(order.size, dtype=bool)
        inside[:frozen] = True
        held = np.array([tokens[(stage == k) & inside].sum(axis=0) for k in range(len(ends))])
        table = blend_accounting(order, seq_group_tokens, weights, ends, names, max_rep, max_frac)  # repetition: the whole schedule's
        suffix = tokens.copy()
        suffix[:frozen] = 0
        after = np.array([suffix[stage == k].sum(axis=0) for k in range(len(ends))])
        share = after / np.maximum(after.sum(axis=1, keepdims=True), 1.0)
        return table.with_columns(realized_share=pl.Series(share.ravel()), realized_tokens=pl.Series(after.ravel().astype(np.int64)),
                                  frozen_tokens=pl.Series(held.ravel().astype(np.int64)))
    corpus = seq_group_tokens.sum(axis=0)
    scheduled = tokens.sum(axis=0)
    distinct = seq_group_tokens[np.unique(order)].sum(axis=0)
    rows = []
    bounds = np.r_[0, np.cumsum(tokens.sum(axis=1))]
    for k in range(len(ends)):
        got = tokens[stage == k].sum(axis=0)
        at = np.flatnonzero(stage == k)
        lo, hi = (int(bounds[at[0]]), int(bounds[at[-1] + 1])) if at.size else (0, 0)
        for g, name in enumerate(names):
            rows.append({"stage": k, "group": name, "start_tokens": lo, "end_tokens": hi, "target_share": float(weights[k, g]),
                         "realized_share": float(got[g] / max(got.sum(), 1.0)), "realized_tokens": int(got[g]),
                         "corpus_tokens": int(corpus[g]), "scheduled_tokens": int(scheduled[g]),
                         "repetition": float(scheduled[g] / max(corpus[g], 1.0)), "max_repetition": float(max_rep[g]),
                         "distinct_fraction": float(distinct[g] / max(corpus[g], 1.0)), "max_fraction": float(max_frac[g])})
    return pl.DataFrame(rows, schema=BLEND_SCHEMA)


def stage_l1(table: pl.DataFrame) -> dict[int, float]:
    """L1 distance of realized from target group shares, per stage."""
    t = table.group_by("stage").agg((pl.col("realized_share") - pl.col("target_share")).abs().sum().alias("l1")).sort("stage")
    return dict(zip(t["stage"].to_list(), t["l1"].to_list()))


def document_uses(segments: pl.DataFrame, doc_group: dict[int, str], planned: np.ndarray, order: np.ndarray,
                  caps: dict[str, int]) -> pl.DataFrame:
    """One row per document piece of the packing (doc_id, sequence_id, n_tokens, group): its
    planned uses (the solver's copies of its sequence), realized uses (the sequence's
    occurrences in the written order) and cap (its own group's, ``caps``: :func:`piece_caps`)."""
    n = int(segments["sequence_id"].max()) + 1
    realized = np.bincount(order, minlength=n)
    sid = segments["sequence_id"].to_numpy()
    return pl.DataFrame({
        "doc_id": segments["doc_id"].cast(pl.Int64), "sequence_id": segments["sequence_id"].cast(pl.Int64),
        "n_tokens": segments["n_tokens"].cast(pl.Int64),
        "group": pl.Series([doc_group[int(d)] for d in segments["doc_id"].to_list()], dtype=pl.String),
        "planned_uses": pl.Series(planned[sid].astype(np.int64)), "realized_uses": pl.Series(realized[sid].astype(np.int64)),
    }).with_columns(cap=pl.col("group").replace_strict(caps, return_dtype=pl.Int64))


def frozen_document_uses(segments: pl.DataFrame, doc_group: dict[int, str], plan: FrozenPlan, sequence_ids: np.ndarray,
                         order: np.ndarray, frozen: int, caps: dict[str, int]) -> pl.DataFrame:
    """:func:`document_uses` after a frozen prefix of ``frozen`` positions, split: per document piece
    its planned uses in the prefix (the frozen record's) and after it (the plan's), the same
    realized in the written order's positions before and after ``frozen`` (``plan`` rows are
    ``sequence_ids``' rows), and its own cap on all uses. planned_uses and realized_uses are the sums."""
    n = int(max(int(segments["sequence_id"].max()), int(sequence_ids.max()))) + 1

    def by_id(values: np.ndarray) -> np.ndarray:
        out = np.zeros(n, dtype=np.int64)
        out[sequence_ids] = values
        return out

    pre, post = by_id(plan.prefix), by_id(plan.suffix)
    got_pre = np.bincount(order[:frozen], minlength=n)
    got_post = np.bincount(order[frozen:], minlength=n)
    sid = segments["sequence_id"].to_numpy()
    base = document_uses(segments, doc_group, pre + post, order, caps)
    return base.with_columns(
        prefix_planned=pl.Series(pre[sid]), suffix_planned=pl.Series(post[sid]), prefix_realized=pl.Series(got_pre[sid].astype(np.int64)),
        suffix_realized=pl.Series(got_post[sid].astype(np.int64))).select(*base.columns[:-1], pl.exclude(base.columns), "cap")


PLAN_SCHEMA = {"doc_id": pl.Int64, "id": pl.String, "content_hash": pl.String, "group": pl.String, "n_tokens": pl.Int64,
               "prefix_token_uses": pl.Int64, "planned_token_uses": pl.Int64, "realized_token_uses": pl.Int64,
               "previous_planned_token_uses": pl.Int64, "status": pl.String}


def document_plan(uses: pl.DataFrame, keys: pl.DataFrame, previous: pl.DataFrame | None) -> pl.DataFrame:
    """One row per document (``PLAN_SCHEMA``): its tokens, its token uses in the frozen prefix,
    planned and realized in the whole schedule, and planned by the plan this one replaced
    (``previous``, matched by corpus id and content hash; null without one; when ``previous`` is
    this very plan, materialized again, the plan *it* replaced). status: ``dropped``
    when the replaced plan used it and this one does not (reported, not lost unseen),
    ``unused`` when neither does, ``planned`` otherwise."""
    per = (uses.group_by("doc_id").agg(pl.col("group").first(), pl.col("n_tokens").sum(),
                                       (pl.col("n_tokens") * pl.col("prefix_realized")).sum().alias("prefix_token_uses"),
                                       (pl.col("n_tokens") * pl.col("planned_uses")).sum().alias("planned_token_uses"),
                                       (pl.col("n_tokens") * pl.col("realized_uses")).sum().alias("realized_token_uses"))
           .join(keys.select("doc_id", "id", "content_hash"), on="doc_id", how="left"))
    if previous is not None:
        prev = previous.select("id", "content_hash", pl.col("planned_token_uses").alias("_prev"),
                               pl.col("previous_planned_token_uses").alias("_prev_base"))
        per = per.join(prev, on=["id", "content_hash"], how="left")
        # the same plan materialized again keeps the plan it replaced: a drop stays reported until the mix changes again
        same = previous.height == per.height and bool((per["_prev"] == per["planned_token_uses"]).fill_null(False).all())
        per = per.with_columns(previous_planned_token_uses=pl.col("_prev_base" if same else "_prev")).drop("_prev", "_prev_base")
    else:
        per = per.with_columns(previous_planned_token_uses=pl.lit(None, dtype=pl.Int64))
    was_used = pl.col("previous_planned_token_uses").fill_null(0) > 0
    status = (pl.when((pl.col("planned_token_uses") == 0) & was_used).then(pl.lit("dropped"))
              .when(pl.col("planned_token_uses") == 0).then(pl.lit("unused")).otherwise(pl.lit("planned")))
    return per.with_columns(status=status).select(list(PLAN_SCHEMA)).cast(PLAN_SCHEMA).sort("doc_id")
