"""Blends: token weights over the groups of any documents column, by stage, realized and ordered.

A *blend* (``mixture.weights`` or ``mixture.stages``, docs/mixture.md "Blends") gives each group of
a documents column (``mixture.column``: ``source`` by default; a numeric column cut into
``mixture.bins`` token quantiles) a share of the schedule's tokens, piecewise constant by tokens:
stage k holds weights w_k from ``until_tokens`` of stage k-1 to its own (fractions of the schedule).
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

from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.heavy import lazy
from pipeline.ordering.characteristics import Family
from pipeline.ordering.curriculum import targets_blocked_order
from pipeline.ordering.features import Csr, SequenceFeatures
from pipeline.ordering.greedy import Objective, _dominant
from pipeline.ordering.schedule import repeat_counts

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

    @staticmethod
    def from_config(mixture) -> "Blend | None":
        """The blend of a ``MixtureConfig`` (``mixture.weights`` or ``mixture.stages``), None without one."""
        if mixture.stages:
            stages = [(s.until_tokens, s.weights) for s in mixture.stages]
        elif mixture.weights:
            stages = [(1.0, mixture.weights)]
        else:
            return None

        def pairs(d: dict) -> tuple:
            return tuple(sorted((str(k), float(v)) for k, v in d.items()))

        return Blend(mixture.column, mixture.bins, tuple(float(e) for e, _ in stages), tuple(pairs(w) for _, w in stages),
                     pairs(mixture.max_repetition), pairs(mixture.max_fraction))

    def key(self, i: int) -> str:
        """The config key of stage i's weights (for error messages)."""
        return f"mixture.stages[{i}].weights" if len(self.ends) > 1 or self.ends != (1.0,) else "mixture.weights"

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


def planned_counts(features: SequenceFeatures, groups: Csr, blend: Blend, names: list[str], budget: float,
                   max_sequence_copies: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Step 1 of the module docstring: the copies r_s of every row and the (stages x groups) weights."""
    w = blend.matrix(names)
    share = np.diff(np.r_[0.0, blend.ends]) @ w  # each group's share of the whole schedule
    corpus = groups.column_totals()
    max_rep, max_frac = blend.caps(names, "max_repetition", 1.0), blend.caps(names, "max_fraction", 1.0)
    fits = np.where(share > 0, max_rep * max_frac * corpus / np.maximum(share, 1e-300), np.inf)
    budget = float(min(budget, fits.min()))  # every group's tokens within its caps: the weights before the budget
    if not budget > 0:
        raise StrataInputError("the blend gives weight to a group this corpus holds no tokens of",
                               fix=f"give weight to groups among {[n for n, c in zip(names, corpus) if c > 0]}")
    cap = row_caps(features, groups, max_rep, max_frac, max_sequence_copies, seed)
    counts = repeat_counts(replace(features, clusters=groups), share, budget, int(max_sequence_copies), seed, caps=cap)
    return balance_counts(groups, counts, cap, share), w


def row_caps(features: SequenceFeatures, groups: Csr, max_rep: np.ndarray, max_frac: np.ndarray, max_sequence_copies: int,
             seed: int, used: np.ndarray | None = None) -> np.ndarray:
    """Uses each row may have in the whole schedule: ceil(``max_repetition``) of the group it mostly
    holds, at most ``max_sequence_copies``, and 0 for the rows beyond ``max_fraction`` of their
    group's distinct tokens (a seeded subsample; the rows ``used`` > 0, a frozen prefix's, first)."""
    dom = _dominant(groups)
    cap = np.minimum(int(max_sequence_copies), np.ceil(max_rep[dom] - 1e-9)).astype(np.int64)
    rng = np.random.default_rng(seed)
    for g in np.flatnonzero(max_frac < 1.0):  # a seeded subsample of the group's sequences holds its max_fraction
        rows = np.flatnonzero(dom == g)
        rows = rows[rng.permutation(rows.size)]
        if used is not None:  # the rows a frozen prefix already used stay in the subsample
            rows = rows[np.argsort(used[rows] == 0, kind="stable")]
        kept = np.cumsum(features.lengths[rows]) <= max_frac[g] * features.lengths[rows].sum() + 1e-9
        cap[rows[~kept]] = 0
    return cap


@dataclass(frozen=True)
class FrozenPlan:
    """A blend's plan after a frozen prefix, per row of the packing: its uses in the prefix, its
    planned uses after it, and its cap on all uses; the (stages x groups) weights and the prefix's tokens."""

    prefix: np.ndarray
    suffix: np.ndarray
    cap: np.ndarray
    weights: np.ndarray
    prefix_tokens: float


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
    suffix = np.zeros(n, dtype=np.int64)
    total = max(float(budget), t_p)
    if (suffix_need(blend.ends, w, t_p, total) > room).any():
        lo, hi = t_p, total
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if (suffix_need(blend.ends, w, t_p, mid) <= room).all() else (lo, mid)
        total = lo
    rest = cap - np.minimum(cap, used)
    if total - t_p >= 1.0 and rest.any():
        need = suffix_need(blend.ends, w, t_p, total)
        share = need / need.sum()
        counts = repeat_counts(replace(features, clusters=groups), share, total - t_p, int(max_sequence_copies), seed, caps=rest)
        suffix = balance_counts(groups, counts, rest, share)
    return FrozenPlan(used, suffix, cap, w, t_p)


def balance_counts(groups: Csr, counts: np.ndarray, cap: np.ndarray, share: np.ndarray, steps_per_group: int = 20) -> np.ndarray:
    """The rounded copies nudged one copy at a time towards the groups' shares of the schedule:
    each step adds or removes the one copy (within 0..cap) that most lowers the squared distance
    of the group tokens from ``share`` x their total, until none does. Rounding mixed sequences
    leaves the totals a few sequences off, and a last stage of 10-30% of the tokens takes the
    whole error (the demo domains of tests/test_blend.py, seeds 0-7: the last 30%'s L1 up to 0.067 without
    this step, at most 0.028 with it)."""
    counts = counts.astype(np.int64).copy()
    c = sparse.csr_matrix((groups.data, groups.indices, groups.indptr), shape=(groups.n_rows, groups.n_cols))
    sq = np.asarray(c.multiply(c).sum(axis=1)).ravel()
    size = np.asarray(c.sum(axis=1)).ravel()
    got = c.T @ counts
    for _ in range(steps_per_group * groups.n_cols):
        d = got - share * got.sum()  # excess tokens of each group
        # adding row s changes the excess by c_s - share l_s: the squared norm by 2 d.(c_s - share l_s) + |c_s - share l_s|^2
        proj = c @ d - size * float(share @ d)
        own = sq - 2.0 * size * (c @ share) + size**2 * float(share @ share)
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
    """Step 2: the rows of the schedule (row s ``counts[s]`` times) in order. After a frozen prefix
    of ``prefix_tokens`` tokens the stages' ends stay fractions of the whole schedule (prefix
    included) and the targets are counted from the prefix's end: the rows follow the stages'
    weights from there on, and what the prefix realized (under an earlier mix) is not made up for."""
    rows = np.repeat(np.arange(features.n_sequences, dtype=np.int64), counts)
    if rows.size == 0:
        raise StrataInputError("the blend schedules no sequence", fix="raise mixture_budget_tokens (0 = the corpus's tokens)")
    sched = features.take_rows(rows)
    sched = replace(sched, columns={**sched.columns, GROUP_FAMILY: groups.take_rows(rows)})
    others = tuple(f for f in objective.families if f.name != GROUP_FAMILY)
    obj = Objective((Family(GROUP_FAMILY, GROUP_WEIGHT * sum(f.weight for f in others)), *others))
    total = float(sched.lengths.sum())
    kappas = {"cluster": within_groups(sched.columns[GROUP_FAMILY], sched.clusters, sched.lengths),
              "length_bin": within_groups(sched.columns[GROUP_FAMILY], sched.bins, sched.lengths)}
    targets = StageTargets(np.maximum(np.asarray(ends) * (total + prefix_tokens) - prefix_tokens, 0.0), weights, kappas)
    weights_by = {f.name: f.weight for f in obj.families}
    order = targets_blocked_order(sched, targets, obj, weights_by, greedy_block, noise, seed, drain_in_rounds=True,
                                  targeted=GROUP_FAMILY)
    return rows[order]


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


def document_uses(segments: pl.DataFrame, doc_group: dict[int, str], planned: np.ndarray, order: np.ndarray) -> pl.DataFrame:
    """One row per document piece of the packing (doc_id, sequence_id, n_tokens, group): its
    planned uses (the solver's copies of its sequence) and realized uses (the sequence's
    occurrences in the written order)."""
    n = int(segments["sequence_id"].max()) + 1
    realized = np.bincount(order, minlength=n)
    sid = segments["sequence_id"].to_numpy()
    return pl.DataFrame({
        "doc_id": segments["doc_id"].cast(pl.Int64), "sequence_id": segments["sequence_id"].cast(pl.Int64),
        "n_tokens": segments["n_tokens"].cast(pl.Int64),
        "group": pl.Series([doc_group[int(d)] for d in segments["doc_id"].to_list()], dtype=pl.String),
        "planned_uses": pl.Series(planned[sid].astype(np.int64)), "realized_uses": pl.Series(realized[sid].astype(np.int64)),
    })


def frozen_document_uses(segments: pl.DataFrame, doc_group: dict[int, str], plan: FrozenPlan, sequence_ids: np.ndarray,
                         order: np.ndarray, frozen: int) -> pl.DataFrame:
    """:func:`document_uses` after a frozen prefix of ``frozen`` positions, split: per document piece
    its planned uses in the prefix (the frozen record's) and after it (the plan's), the same
    realized in the written order's positions before and after ``frozen``, and its cap on all uses
    (``plan`` rows are ``sequence_ids``' rows). planned_uses and realized_uses are the sums."""
    n = int(max(int(segments["sequence_id"].max()), int(sequence_ids.max()))) + 1

    def by_id(values: np.ndarray) -> np.ndarray:
        out = np.zeros(n, dtype=np.int64)
        out[sequence_ids] = values
        return out

    pre, post, cap = by_id(plan.prefix), by_id(plan.suffix), by_id(plan.cap)
    got_pre = np.bincount(order[:frozen], minlength=n)
    got_post = np.bincount(order[frozen:], minlength=n)
    sid = segments["sequence_id"].to_numpy()
    base = document_uses(segments, doc_group, pre + post, order)
    return base.with_columns(
        prefix_planned=pl.Series(pre[sid]), suffix_planned=pl.Series(post[sid]), prefix_realized=pl.Series(got_pre[sid].astype(np.int64)),
        suffix_realized=pl.Series(got_post[sid].astype(np.int64)), cap=pl.Series(cap[sid]))


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
