"""Each paper's measurable claim, reproduced on the user's corpus (DuckDB ``claims``, ``strata claims``).

One row per claim: the paper, the claim, the paper's own figure (quoted from its text, with where
it stands), Strata's figure with a 95% interval, and a verdict that the interval alone decides
(:func:`verdict`): *reproduced* when the whole interval lies on the claimed side of the claim's
threshold, *not reproduced* when it lies wholly on the other side, *inconclusive* otherwise (and
whenever there are too few units for an interval). Nothing here is entered by hand but the
papers' figures.

Adding a claim is one function: decorate ``fn(data: ClaimData) -> list[Claim]`` with
``@claim("name")``; raise :class:`MissingData` when the data it needs does not exist in this data
root (it is then listed as not measured, with the reason). The computations are plain functions
of arrays (``prefix_indicators``, ``worst_best_gaps``, ``log_ratio_matrix``, ``spread_bootstrap``,
``boundary_ratios``, ``paired_units``), so tests can hand them cases with a known answer.

Intervals (the unit of resampling is named in each row's ``interval``): a two-way bootstrap
(``pipeline.reports.stats.paired_bootstrap``) over (random shuffles x prefixes), (seeds x probe
batches), (seeds x epoch boundaries) or (seeds x held-out documents); a one-way bootstrap over
random shuffles, over sequences, or over chunks. ``n_boot`` replicates, percentile interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Mapping

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.render.markdown import table_lines
from pipeline.reports import diagnostics as D
from pipeline.reports import stationarity as S
from pipeline.reports.claim_plots import (
    plot_diversity_claim,
    plot_epoch_claim,
    plot_fidelity_claim,
    plot_min_stable_rank_claim,
    plot_packing_claim,
    plot_packing_protocol_claim,
    plot_prefix_claim,
    plot_stable_rank_claim,
    plot_stationarity_claim,
    plot_worst_best_claim,
)
from pipeline.reports.stats import offdiagonal, paired_bootstrap
from pipeline.training.loop import epoch_boundary_jumps

Side = Literal[">", ">=", "<"]
VERDICTS = ("reproduced", "not reproduced", "inconclusive")
DSO, DOT, TERRIFIC, PACKING = "Don't Shuffle, Optimize", "Diversity-ordered training", "TerRIFIC curricula", "Packing & shuffling"
PAPERS = (DSO, DOT, TERRIFIC, PACKING)

CLAIM_SCHEMA = {
    "key": pl.String, "paper": pl.String, "claim": pl.String, "paper_figure": pl.String, "paper_source": pl.String,
    "value": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64, "threshold": pl.Float64, "side": pl.String,
    "verdict": pl.String, "interval": pl.String, "n": pl.Int64, "detail": pl.String, "figure": pl.String,
}


def verdict(low: float, high: float, threshold: float, side: Side) -> str:
    """The verdict of an interval [low, high] on the claim ``value <side> threshold``.

    ``>``: reproduced when low > threshold, not reproduced when high < threshold. ``>=`` (a claim
    at the edge of the statistic's range, e.g. a fraction that must be 1): reproduced when low >=
    threshold, not reproduced when high < threshold. ``<``: reproduced when high < threshold, not
    reproduced when low > threshold. A NaN bound (too few units) is inconclusive.
    """
    if side not in (">", ">=", "<"):
        raise StrataInputError(f"unknown claim side {side!r}", fix="use '>', '>=' or '<'")
    if math.isnan(low) or math.isnan(high):
        return "inconclusive"
    if side == "<":
        return "reproduced" if high < threshold else "not reproduced" if low > threshold else "inconclusive"
    if (low > threshold) or (side == ">=" and low >= threshold):
        return "reproduced"
    return "not reproduced" if high < threshold else "inconclusive"


@dataclass(frozen=True)
class Claim:
    """One measured claim; ``value`` and its interval are Strata's, ``paper_figure`` the paper's."""

    key: str
    paper: str
    claim: str
    paper_figure: str
    paper_source: str
    value: float
    ci_low: float
    ci_high: float
    threshold: float
    side: Side
    interval: str
    n: int
    detail: str = ""
    figure: str = ""

    @property
    def verdict(self) -> str:
        return verdict(self.ci_low, self.ci_high, self.threshold, self.side)

    def row(self) -> dict:
        return {**{k: getattr(self, k) for k in CLAIM_SCHEMA if k != "verdict"}, "verdict": self.verdict}


def claims_frame(claims: list[Claim]) -> pl.DataFrame:
    """Claims as rows of :data:`CLAIM_SCHEMA` (the DuckDB table ``claims``)."""
    return pl.DataFrame([c.row() for c in claims], schema=CLAIM_SCHEMA)


class MissingData(Exception):
    """A claim's inputs do not exist in this data root; the message says what to run."""


@dataclass
class ClaimData:
    """Everything the claim functions read (``None`` / empty where the data root lacks it).

    ``schedule``: the base packing with greedy's order (its ``position``), for the ordering claims;
    ``random_positions``: positions of ``claims_shuffles`` random shuffles of the same sequences.
    ``diversity``: Diversity-ordered training's strategies (original, round_robin, stratified,
    bin_packing, and random, greedy beside them) at ``diversity_k`` clusters, each with its own
    packing. ``stable_rank``: the ``stable_rank`` table's rows; ``fidelity``: {strategy: n x n
    cosine matrix}; ``claim_log`` / ``claim_heldout`` / ``claim_arms``: the claims' own runs
    (``claim_runs``). ``table(name)`` reads any other warehouse table (None when absent). Claims
    may leave side tables in ``tables_out`` and figures in ``out_dir``.
    """

    out_dir: Path
    batch_size: int
    n_boot: int = 2000
    seed: int = 0
    schedule: D.Schedule | None = None
    random_positions: list[np.ndarray] = field(default_factory=list)
    diversity: dict[str, D.Schedule] = field(default_factory=dict)
    diversity_k: int = 0
    stable_rank: pl.DataFrame | None = None
    fidelity: dict[str, np.ndarray] = field(default_factory=dict)
    claim_log: pl.DataFrame | None = None
    claim_heldout: pl.DataFrame | None = None
    claim_arms: pl.DataFrame | None = None
    claim_sequences: pl.DataFrame | None = None  # paper-protocol packing runs: every sequence's training loss
    prefix: int = 0  # sequences training consumes (max_steps x batch_size): the stationarity claim's prefix
    table: Callable[[str], pl.DataFrame | None] = lambda name: None
    tables_out: dict[str, pl.DataFrame] = field(default_factory=dict)

    def figure(self, name: str) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        return self.out_dir / f"{name}.png"


ClaimFn = Callable[[ClaimData], list[Claim]]
CLAIMS: dict[str, ClaimFn] = {}


def claim(name: str) -> Callable[[ClaimFn], ClaimFn]:
    """Register a claim function under ``name`` (rows come out in registration order)."""
    def register(fn: ClaimFn) -> ClaimFn:
        CLAIMS[name] = fn
        return fn

    return register


def evaluate(data: ClaimData, names: list[str] | None = None,
             progress: Callable[[str], None] | None = None) -> tuple[list[Claim], dict[str, str]]:
    """Run the registered claims (or ``names``): ``(claims, {name: why not measured})``."""
    out: list[Claim] = []
    missing: dict[str, str] = {}
    for name in names or list(CLAIMS):
        if progress is not None:
            progress(name)
        try:
            out += CLAIMS[name](data)
        except MissingData as why:
            missing[name] = str(why)
    return out, missing


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


def interval_2way(d: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    """(mean, low, high) of a (groups x units) matrix by the two-way bootstrap of
    ``paired_bootstrap``; NaN bounds with fewer than 2 cells (no interval from one value)."""
    d = np.asarray(d, dtype=np.float64)
    d = d.reshape(-1, 1) if d.ndim == 1 else d
    if d.size < 2:
        return float(d.mean()) if d.size else math.nan, math.nan, math.nan
    return paired_bootstrap(d, n_boot, seed)


def mean_replicates(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` bootstrap replicates of the mean of ``x`` (resampling its elements).

    Exact and cheap for a statistic with few distinct values (clusters per sequence): a
    resample's counts of the distinct values are multinomial, so the cost does not grow with
    ``x.size``.
    """
    values, counts = np.unique(np.asarray(x, dtype=np.float64), return_counts=True)
    draws = rng.multinomial(int(counts.sum()), counts / counts.sum(), size=n_boot)
    return draws @ values / counts.sum()


def percentile_interval(reps: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    a = (1.0 - level) / 2
    lo, hi = np.quantile(reps, [a, 1.0 - a])
    return float(lo), float(hi)


def _fmt(v: float, digits: int = 3) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}g}"


# ---------------------------------------------------------------------------------------------
# Don't Shuffle, Optimize: prefix error and the worst vs the best batch
# ---------------------------------------------------------------------------------------------

DSO_ADHERENCE = "Results › Adherence To Our Uniform Distribution Objective"


PREFIX_LOG_POINTS = 240  # log-spaced prefixes of the prefix claim (its figure is log-log: the start of training resolved)
PREFIX_EVEN_POINTS = 64  # evenly spaced ones beside them (the rest of the stream)


def prefix_grid(n_sequences: int, n_points: int = PREFIX_LOG_POINTS, n_even: int = PREFIX_EVEN_POINTS) -> np.ndarray:
    """Prefix lengths t < M compared by the prefix claim, over the whole stream of M sequences:
    ``log_spaced_points(M, n_points)`` (the start of training, where Don't Shuffle, Optimize's
    "at all times during training" is hardest to keep) and ``n_even`` evenly spaced (all of it);
    t = M is left out (every order has error 0 there)."""
    t = np.r_[D.log_spaced_points(n_sequences, n_points), np.linspace(1, n_sequences, n_even).round()]
    t = np.unique(t.astype(np.int64))
    return t[t < n_sequences]


def prefix_indicators(greedy_err: np.ndarray, random_err: np.ndarray) -> np.ndarray:
    """(shuffles x prefixes) 1.0 where greedy's prefix error is strictly below the shuffle's."""
    return (np.asarray(greedy_err)[None, :] < np.asarray(random_err)).astype(np.float64)


def _kinds(schedule: D.Schedule) -> tuple[tuple[str, str, D.Composition], ...]:
    return (("clusters", "cluster", schedule.clusters), ("length_bins", "length-bin", schedule.bins))


def _ordering_inputs(data: ClaimData) -> tuple[D.Schedule, list[np.ndarray]]:
    if data.schedule is None or len(data.random_positions) < 2:
        raise MissingData("needs the greedy ordering of the base packing (materialize orderings[greedy])")
    m = data.schedule.n_sequences
    if any(np.asarray(p).size != m for p in data.random_positions):
        raise StrataInputError(f"random shuffles of {sorted({np.asarray(p).size for p in data.random_positions})} sequences "
                               f"beside a greedy ordering of {m}", fix="shuffle every sequence the greedy ordering orders")
    return data.schedule, data.random_positions


@claim("dso_prefix_error")
def prefix_error_claims(data: ClaimData) -> list[Claim]:
    """Don't Shuffle, Optimize: greedy's prefix error ||T(t) - tau S(t)|| / S(t) is below random's at
    every prefix, for clusters and for length bins. Strata's figure: the fraction of (shuffle,
    prefix) pairs where greedy is strictly below; claimed: 1 (every prefix). Interval: two-way
    bootstrap over random shuffles x prefixes. Measured on the whole ordering (every one of its M
    sequences, no sample) at the prefixes of :func:`prefix_grid` (240 log-spaced, 64 even)."""
    sched, randoms = _ordering_inputs(data)
    t = prefix_grid(sched.n_sequences)
    curves, out = {}, []
    for kind, label, comp in _kinds(sched):
        g = D.prefix_errors(comp, sched.position, t)
        r = np.stack([D.prefix_errors(comp, p, t) for p in randoms])
        ind = prefix_indicators(g, r)
        mean, lo, hi = interval_2way(ind, data.n_boot, data.seed)
        curves[kind] = (g, r)
        lost = t[ind.mean(axis=0) < 1.0]
        where = (f"; greedy not below at t = {', '.join(map(str, lost[:6]))}{' …' if lost.size > 6 else ''} of {sched.n_sequences}"
                 if lost.size else "")
        out.append(Claim(
            key=f"dso.prefix_error.{kind}", paper=DSO,
            claim=f"greedy's prefix error ({label} shares) is below random's at every prefix",
            paper_figure="every prefix (fraction 1): \"At all times during training, our algorithm yields cumulative "
                         "characteristic counts that are closer to our uniformity objective than random sampling\"",
            paper_source=DSO_ADHERENCE, value=mean, ci_low=lo, ci_high=hi, threshold=1.0, side=">=",
            interval=f"two-way bootstrap over {len(randoms)} random shuffles x {t.size} prefixes",
            n=int(ind.size),
            detail=f"fraction of (shuffle, prefix) pairs with greedy below, over the whole ordering ({sched.n_sequences:,} "
                   f"sequences; {t.size} prefixes); median error ratio greedy/random "
                   f"{_fmt(float(np.median(g / np.maximum(np.median(r, axis=0), 1e-300))))}{where}",
        ))
    path = plot_prefix_claim(t, curves, data.figure("claim_prefix_error"))
    return [Claim(**{**c.__dict__, "figure": str(path)}) for c in out]


@claim("dso_stationarity")
def stationarity_claims(data: ClaimData) -> list[Claim]:
    """Don't Shuffle, Optimize's goal: the characteristics of the data trained on are constant
    throughout training, for *any* measurable trait, targeted or not. Strata's figure: how far
    greedy's profile (every characteristic of ``pipeline.reports.stationarity``, per tenth of the
    stream and over the consumed prefix) reaches into the simultaneous envelope of the random
    shuffles: its largest standardized deviation divided by the envelope's z* (at most 1 = every
    part inside random's band, the ordering_is_stationary check). Claimed: below 1. Interval:
    bootstrap over the random shuffles (each replicate recomputes the band's mean, spread and z*)."""
    sched, randoms = _ordering_inputs(data)
    if data.prefix < 1:
        raise MissingData("needs the sequences training consumes (max_steps x batch_size)")
    orders = [sched.order] + [np.argsort(p, kind="stable") for p in randoms]
    names, n, values = S.profiles(sched, data.prefix, orders)
    one_sided = np.isin(names, S.SHARE)[:, None]
    greedy, shuffles = values[0], values[1:]
    value, per_char, z_star = S.envelope_ratio(greedy, shuffles, n, one_sided)
    rng = np.random.default_rng(data.seed)
    reps = np.array([S.envelope_ratio(greedy, shuffles[rng.integers(0, len(shuffles), len(shuffles))], n, one_sided)[0]
                     for _ in range(data.n_boot)])
    lo, hi = percentile_interval(reps)
    worst = names[int(np.argmax(per_char))]
    path = plot_stationarity_claim(names, per_char, z_star, data.figure("claim_stationarity"))
    return [Claim(
        key="dso.stationarity", paper=DSO,
        claim="every characteristic (clusters and documents per sequence, document length, concentration, cluster / "
              "length-bin / source shares) stays inside random's band in every tenth and over the consumed prefix",
        paper_figure="constant: \"we intend to ensure that the characteristics of the data we train on are constant "
                     "throughout training\" (any measurable trait)",
        paper_source="Goal", value=value, ci_low=lo, ci_high=hi, threshold=1.0, side="<",
        interval=f"bootstrap over {len(randoms)} random shuffles (the band recomputed per replicate)",
        n=len(randoms), figure=str(path),
        detail=f"greedy's largest standardized deviation {per_char.max():.2f} ({worst}) against the envelope's z* = {z_star:.2f}; "
               + ", ".join(f"{c} {z:.2f}" for c, z in zip(names, per_char)),
    )]


def worst_best_gaps(greedy_dev: np.ndarray, random_devs: list[np.ndarray]) -> np.ndarray:
    """Per random shuffle: greedy's worst batch deviation minus the shuffle's best batch deviation
    (negative: greedy's worst batch is more diverse than random's best)."""
    worst = float(np.max(greedy_dev))
    return np.array([worst - float(np.min(d)) for d in random_devs])


@claim("dso_worst_vs_best_batch")
def worst_best_claims(data: ClaimData) -> list[Claim]:
    """Don't Shuffle, Optimize: the worst greedy batch is more diverse than the best random batch
    (clusters and length bins). Diversity of a batch: its largest token-share deviation
    max_j |rho_j(batch) - rho_j| (lower = more diverse), over the training batches of
    ``batch_size`` sequences. Strata's figure: greedy's worst minus random's best, mean over
    shuffles; claimed < 0. Interval: bootstrap over random shuffles."""
    sched, randoms = _ordering_inputs(data)
    b = data.batch_size
    devs, out = {}, []
    for kind, label, comp in _kinds(sched):
        g = D.batch_deviations(comp, sched.position, b)
        r = [D.batch_deviations(comp, p, b) for p in randoms]
        if g.size < 2:
            raise MissingData(f"fewer than 2 training batches of {b} sequences")
        gaps = worst_best_gaps(g, r)
        mean, lo, hi = interval_2way(gaps, data.n_boot, data.seed)
        devs[kind] = (g, r)
        best = np.array([d.min() for d in r])
        out.append(Claim(
            key=f"dso.worst_vs_best_batch.{kind}", paper=DSO,
            claim=f"the worst greedy batch is more diverse than the best random batch ({label} shares)",
            paper_figure="worst greedy < best random: \"the worst batch produced by our algorithm contains higher characteristic "
                         "diversity (across both cluster membership and document size) than the best batch produced by random shuffling\"",
            paper_source=DSO_ADHERENCE, value=mean, ci_low=lo, ci_high=hi, threshold=0.0, side="<",
            interval=f"bootstrap over {len(randoms)} random shuffles", n=len(randoms),
            detail=f"greedy's worst batch deviates {_fmt(float(g.max()))}, random's best {_fmt(float(np.median(best)))} "
                   f"(median of {len(randoms)} shuffles; held in {int((gaps < 0).sum())}/{len(randoms)}); "
                   f"{g.size} batches of {b} sequences",
        ))
    path = plot_worst_best_claim(devs, b, data.figure("claim_worst_vs_best_batch"))
    return [Claim(**{**c.__dict__, "figure": str(path)}) for c in out]


# ---------------------------------------------------------------------------------------------
# Don't Shuffle, Optimize: stable rank of batch gradients, greedy vs random, paired
# ---------------------------------------------------------------------------------------------


def log_ratio_matrix(rows: pl.DataFrame, checkpoint: str, block: str, a: str = "greedy", b: str = "random") -> np.ndarray:
    """(seeds x probes) mean over the block's matrices (every layer) of log srank_a - log srank_b.

    Probe i of run (a, seed) is paired with probe i of run (b, seed): same init, same point of
    training, the i-th batch each schedule serves next. Cells either run lacks are dropped
    (seeds and probes both runs have).
    """
    keys = ["seed", "probe", "layer_name"]
    sel = rows.filter((pl.col("checkpoint") == checkpoint) & (pl.col("block") == block))
    pa = sel.filter(pl.col("strategy") == a).select(*keys, la=pl.col("stable_rank").log())
    pb = sel.filter(pl.col("strategy") == b).select(*keys, lb=pl.col("stable_rank").log())
    d = (pa.join(pb, on=keys, how="inner").group_by("seed", "probe").agg(d=(pl.col("la") - pl.col("lb")).mean())
         .drop_nans().sort("seed", "probe").pivot(on="probe", index="seed", values="d").sort("seed").drop("seed"))
    m = d.to_numpy().astype(np.float64) if d.height else np.zeros((0, 0))
    return m[:, ~np.isnan(m).any(axis=0)] if m.size else m


@claim("dso_stable_rank")
def stable_rank_claims(data: ClaimData) -> list[Claim]:
    """Don't Shuffle, Optimize: greedy's batch gradients have a higher stable rank ||M||_F^2 / ||M||_2^2
    (TerRIFIC curricula's srank) than random's, for attention and MLP blocks, at 20% and 100% of
    training. Strata's figure: the geometric-mean ratio greedy / random over the block's weight
    matrices, paired by seed and probe batch; claimed > 1. Interval: two-way bootstrap over seeds
    x probe batches."""
    rows = data.stable_rank
    if rows is None or rows.height == 0 or "probe" not in rows.columns or not {"greedy", "random"} <= set(rows["strategy"]):
        raise MissingData("needs the stable_rank probes of the greedy and random runs (materialize training_runs)")
    checkpoints = sorted(set(rows["checkpoint"]), key=lambda c: float(c.rstrip("%")))
    out, mats = [], {}
    for cp in checkpoints:
        for block in ("attention", "mlp"):
            d = log_ratio_matrix(rows, cp, block)
            if d.size == 0:
                continue
            mats[(cp, block)] = (sorted(set(rows.filter(pl.col("strategy") == "greedy")["seed"])
                                        & set(rows.filter(pl.col("strategy") == "random")["seed"])), d)
            mean, lo, hi = interval_2way(d, data.n_boot, data.seed)
            out.append(Claim(
                key=f"dso.stable_rank.{block}.{cp}", paper=DSO,
                claim=f"greedy's batch gradients have a higher stable rank than random's ({block} block, {cp} of training)",
                paper_figure="\"substantially higher stable rank for both attention and feed-forward blocks for nearly all layers\" "
                             "(a chart; no number given)",
                paper_source="Results › Quantifying Batch Diversity (checkpoints at 20% and 100% of steps)",
                value=math.exp(mean), ci_low=math.exp(lo), ci_high=math.exp(hi), threshold=1.0, side=">",
                interval=f"two-way bootstrap over {d.shape[0]} seeds x {d.shape[1]} paired probe batches",
                n=int(d.size),
                detail=f"geometric-mean srank ratio greedy/random over the {block} matrices of every layer; "
                       f"greedy higher in {int((d > 0).sum())}/{d.size} paired batches",
            ))
    if not out:
        raise MissingData("the greedy and random runs share no probe batch")
    path = plot_stable_rank_claim(mats, data.figure("claim_stable_rank"))
    return [Claim(**{**c.__dict__, "figure": str(path)}) for c in out]


def log_srank_cube(rows: pl.DataFrame, checkpoint: str, block: str, a: str = "greedy", b: str = "random") -> tuple[np.ndarray, np.ndarray]:
    """(seeds x probes x matrices) log stable rank of runs ``a`` and ``b`` at one checkpoint and block,
    on the cells both have (seeds, probe batches and layer matrices present in both; probe i of
    seed s of ``a`` is paired with probe i of seed s of ``b``)."""
    keys = ["seed", "probe", "layer_name"]
    sel = rows.filter((pl.col("checkpoint") == checkpoint) & (pl.col("block") == block))
    pa = sel.filter(pl.col("strategy") == a).select(*keys, la=pl.col("stable_rank").log())
    pb = sel.filter(pl.col("strategy") == b).select(*keys, lb=pl.col("stable_rank").log())
    j = pa.join(pb, on=keys, how="inner").filter(pl.col("la").is_finite() & pl.col("lb").is_finite())
    if j.height == 0:
        return np.zeros((0, 0, 0)), np.zeros((0, 0, 0))
    seeds, probes, names = (sorted(set(j[c])) for c in keys)
    full = (pl.DataFrame({"seed": seeds}).join(pl.DataFrame({"probe": probes}), how="cross")
            .join(pl.DataFrame({"layer_name": names}), how="cross"))
    cube = full.join(j, on=keys, how="left").sort(keys)
    shape = (len(seeds), len(probes), len(names))
    ga, gb = (cube[c].to_numpy().astype(np.float64).reshape(shape) for c in ("la", "lb"))
    keep_s = ~np.isnan(ga).any(axis=(1, 2))  # seeds, then probes, with every cell (a probe lacks a matrix: drop the probe)
    ga, gb = ga[keep_s], gb[keep_s]
    keep_p = ~np.isnan(ga).any(axis=(0, 2)) if ga.size else np.zeros(0, bool)
    return ga[:, keep_p], gb[:, keep_p]


def min_log_ratio(la: np.ndarray, lb: np.ndarray) -> float:
    """Mean over seeds and matrices of log min_probe srank_a - log min_probe srank_b (the log of the
    geometric-mean ratio of the minimum stable ranks over the probe batches)."""
    return float((la.min(axis=1) - lb.min(axis=1)).mean())


def min_ratio_bootstrap(la: np.ndarray, lb: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    """:func:`min_log_ratio` of two (seeds x probes x matrices) cubes and its percentile interval by a
    two-way bootstrap: each replicate redraws the seeds and the probe batches with replacement, the
    same draw for both runs (paired), and takes each run's minimum over the drawn probes. NaN bounds
    with fewer than 2 seeds x probes."""
    if la.shape != lb.shape:
        raise StrataInputError(f"stable-rank cubes of shapes {la.shape} and {lb.shape}", fix="pair the same seeds, probes and matrices")
    est = min_log_ratio(la, lb) if la.size else math.nan
    n_s, n_p = la.shape[:2]
    if n_s * n_p < 2:
        return est, math.nan, math.nan
    rng = np.random.default_rng(seed)
    reps = np.empty(n_boot)
    for r in range(n_boot):
        s, p = rng.integers(0, n_s, n_s), rng.integers(0, n_p, n_p)
        reps[r] = min_log_ratio(la[s][:, p], lb[s][:, p])
    lo, hi = percentile_interval(reps)
    return est, lo, hi


@claim("terrific_min_stable_rank")
def min_stable_rank_claims(data: ClaimData) -> list[Claim]:
    """TerRIFIC curricula: the ordered stream's *worst* batch gradient has a higher stable rank than
    shuffling's ("comparable to shuffling on average and often has notably better worse batch
    performance", Figure 6: the minimum stable rank over batches per layer). Strata's figure: per
    seed and layer matrix, the minimum srank over the probe batches of greedy and of random; the
    geometric-mean ratio greedy / random of these minima over the block's matrices and the seeds;
    claimed > 1. Interval: two-way bootstrap over seeds x probe batches, paired (one draw of
    probes for both runs; each replicate's minimum is over the drawn probes). The srank is of the
    matrix ``stable_rank_matrix`` names (the paper's: ``activations``, M in R^{T x d})."""
    rows = data.stable_rank
    if rows is None or rows.height == 0 or "probe" not in rows.columns or not {"greedy", "random"} <= set(rows["strategy"]):
        raise MissingData("needs the stable_rank probes of the greedy and random runs (materialize training_runs)")
    out, cells = [], {}
    for cp in sorted(set(rows["checkpoint"]), key=lambda c: float(c.rstrip("%"))):
        for block in ("attention", "mlp"):
            la, lb = log_srank_cube(rows, cp, block)
            if la.size == 0 or la.shape[1] < 2:
                continue
            mean, lo, hi = min_ratio_bootstrap(la, lb, data.n_boot, data.seed)
            mins_a, mins_b = np.exp(la.min(axis=1)), np.exp(lb.min(axis=1))
            cells[(cp, block)] = (mins_a, mins_b)
            out.append(Claim(
                key=f"terrific.min_stable_rank.{block}.{cp}", paper=TERRIFIC,
                claim=f"greedy's worst batch gradient has a higher stable rank than random's ({block} block, {cp} of training)",
                paper_figure="\"notably better worse batch performance\" (Figure 6, minimum stable rank of batch gradients per layer; "
                             "a chart; no number given)",
                paper_source="The Merits of Our Scheduler › Updates Provide Diverse Information, Figure 6",
                value=math.exp(mean), ci_low=math.exp(lo), ci_high=math.exp(hi), threshold=1.0, side=">",
                interval=f"two-way bootstrap over {la.shape[0]} seeds x {la.shape[1]} paired probe batches (minimum over the drawn probes)",
                n=int(la.shape[0] * la.shape[1]),
                detail=f"geometric-mean ratio of the minimum srank over {la.shape[1]} probe batches, greedy/random, over the "
                       f"{la.shape[2]} {block} matrices x {la.shape[0]} seeds; greedy's minimum higher in "
                       f"{int((mins_a > mins_b).sum())}/{mins_a.size} (seed, matrix) cells; median minimum srank greedy "
                       f"{_fmt(float(np.median(mins_a)))}, random {_fmt(float(np.median(mins_b)))}",
            ))
    if not out:
        raise MissingData("the greedy and random runs share fewer than 2 probe batches")
    path = plot_min_stable_rank_claim(cells, data.figure("claim_min_stable_rank"))
    return [Claim(**{**c.__dict__, "figure": str(path)}) for c in out]


# ---------------------------------------------------------------------------------------------
# Diversity-ordered training: the four-strategy table, with the token-share deviation beside it
# ---------------------------------------------------------------------------------------------

DOT_TABLE_STRATEGIES = ("original", "round_robin", "stratified", "bin_packing")
DOT_TABLE = {"original": (17.5, 1, 5.4), "round_robin": (20.8, 1, 10.5), "stratified": (28.6, 9, 1.2), "bin_packing": (26.6, 7, 2.3)}
DIVERSITY_SCHEMA = {
    "strategy": pl.String, "k": pl.Int64, "sequences": pl.Int64, "clusters_per_seq_mean": pl.Float64,
    "clusters_per_seq_min": pl.Float64, "clusters_per_seq_std": pl.Float64, "batch_token_share_dev_mean": pl.Float64,
    "batch_token_share_dev_max": pl.Float64, "paper_mean": pl.Float64, "paper_min": pl.Float64, "paper_std": pl.Float64,
}


def diversity_table(schedules: Mapping[str, D.Schedule], batch_size: int, k: int) -> pl.DataFrame:
    """Diversity-ordered training's table (distinct clusters per sequence: mean, min, population std)
    for each schedule, with the per-batch token-share deviation max_j |rho_j(batch) - rho_j|
    (mean and max over the training batches) beside it, and the paper's row where it has one."""
    rows = []
    for name, s in schedules.items():
        u = s.clusters.unique_per_sequence().astype(np.float64)
        dev = D.batch_deviations(s.clusters, s.position, batch_size)
        paper = DOT_TABLE.get(name, (None, None, None))
        rows.append({"strategy": name, "k": k, "sequences": s.n_sequences, "clusters_per_seq_mean": float(u.mean()),
                     "clusters_per_seq_min": float(u.min()), "clusters_per_seq_std": float(u.std()),
                     "batch_token_share_dev_mean": float(dev.mean()) if dev.size else math.nan,
                     "batch_token_share_dev_max": float(dev.max()) if dev.size else math.nan,
                     "paper_mean": paper[0], "paper_min": paper[1], "paper_std": paper[2]})
    return pl.DataFrame(rows, schema=DIVERSITY_SCHEMA)


def ratio_of_means(a: np.ndarray, bs: list[np.ndarray], n_boot: int, seed: int) -> tuple[float, float, float]:
    """mean(a) / max_i mean(b_i) and its interval, each sample resampled independently (its own
    sequences: every strategy has its own packing)."""
    rng = np.random.default_rng(seed)
    ra = mean_replicates(a, n_boot, rng)
    rb = np.max(np.stack([mean_replicates(b, n_boot, rng) for b in bs]), axis=0)
    lo, hi = percentile_interval(ra / rb)
    return float(np.mean(a) / max(np.mean(b) for b in bs)), lo, hi


@claim("dot_diversity_table")
def diversity_claims(data: ClaimData) -> list[Claim]:
    """Diversity-ordered training's table on this corpus at ``diversity_k`` clusters: the stratified
    order "nearly doubles mean diversity (17.5 -> 28.6 of 30 clusters)" over the original order,
    and beats round-robin and bin-packing. Strata's figure: the ratio of mean distinct clusters per
    sequence; claimed > 1. Interval: bootstrap over each strategy's sequences. The token-share
    deviation per batch stands beside it in ``claims_diversity``: stratified balances document
    *counts*, which on a corpus of many short and few long documents is not token balance."""
    if not set(DOT_TABLE_STRATEGIES) <= set(data.diversity):
        raise MissingData("needs the clusters at claims_k and the packing (materialize clusters and sequences)")
    table = diversity_table(data.diversity, data.batch_size, data.diversity_k)
    data.tables_out["claims_diversity"] = table
    path = str(plot_diversity_claim(table, data.figure("claim_diversity_table")))
    u = {n: s.clusters.unique_per_sequence() for n, s in data.diversity.items()}
    n_seq = {n: s.n_sequences for n, s in data.diversity.items()}
    common = dict(paper=DOT, paper_source="the four-strategy table (131K-token sequences, k=30)", threshold=1.0, side=">", figure=path)
    strat = table.filter(pl.col("strategy") == "stratified").row(0, named=True)
    orig = table.filter(pl.col("strategy") == "original").row(0, named=True)
    mean, lo, hi = ratio_of_means(u["stratified"], [u["original"]], data.n_boot, data.seed)
    out = [Claim(
        key="dot.diversity.stratified_vs_original",
        claim=f"the stratified order raises mean distinct clusters per sequence over the original order (k={data.diversity_k})",
        paper_figure="28.6 / 17.5 = 1.63x (\"nearly doubles mean diversity (17.5 → 28.6 out of 30 clusters)\")",
        value=mean, ci_low=lo, ci_high=hi,
        interval=f"bootstrap over sequences ({n_seq['stratified']} stratified, {n_seq['original']} original)",
        n=n_seq["stratified"] + n_seq["original"],
        detail=f"mean {strat['clusters_per_seq_mean']:.3f} vs {orig['clusters_per_seq_mean']:.3f}, min {strat['clusters_per_seq_min']:.0f} "
               "vs "
               f"{orig['clusters_per_seq_min']:.0f}, std {strat['clusters_per_seq_std']:.3f} vs {orig['clusters_per_seq_std']:.3f}",
        **common,
    )]
    mean, lo, hi = ratio_of_means(u["stratified"], [u["round_robin"], u["bin_packing"]], data.n_boot, data.seed + 1)
    rival = max(("round_robin", "bin_packing"), key=lambda n: float(np.mean(u[n])))
    dev = dict(table.select("strategy", "batch_token_share_dev_mean").iter_rows())
    beside = ", ".join(f"{n} {dev[n]:.3f}" for n in ("stratified", "random", "greedy") if n in dev)
    out.append(Claim(
        key="dot.diversity.stratified_vs_rivals",
        claim="the stratified order has more distinct clusters per sequence than round-robin and bin-packing",
        paper_figure="28.6 vs 26.6 (bin-packing) and 20.8 (round-robin): 28.6 / 26.6 = 1.08x",
        value=mean, ci_low=lo, ci_high=hi, interval="bootstrap over sequences (each strategy's own packing)",
        n=sum(n_seq[n] for n in ("stratified", "round_robin", "bin_packing")),
        detail=f"against the better of the two ({rival}); token-share deviation per batch of {data.batch_size} (mean): {beside}",
        **common,
    ))
    return out


# ---------------------------------------------------------------------------------------------
# TerRIFIC curricula: mixture fidelity, greedy vs random
# ---------------------------------------------------------------------------------------------


def spread_bootstrap(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    """std(off-diagonal cosines of ``a``) - std(those of ``b``) and a paired bootstrap interval over
    chunks: each replicate redraws the chunk indices (the same for both matrices: chunk i of two
    schedules is the same part of training) and keeps the pairs of two different drawn chunks."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n = a.shape[0]
    if a.shape != b.shape or n < 3:
        raise StrataInputError("fidelity matrices differ in shape or have fewer than 3 chunks", fix="use the same fidelity_chunks >= 3")
    est = float(offdiagonal(a).std() - offdiagonal(b).std())
    rng = np.random.default_rng(seed)
    iu, ju = np.triu_indices(n, 1)
    reps = np.empty(n_boot)
    for r in range(n_boot):
        idx = rng.integers(0, n, n)
        i, j = idx[iu], idx[ju]
        keep = i != j
        reps[r] = a[i[keep], j[keep]].std() - b[i[keep], j[keep]].std() if keep.sum() >= 2 else np.nan
    lo, hi = percentile_interval(reps[~np.isnan(reps)])
    return est, lo, hi


FIDELITY_PAPER_RANGE = (0.945, 0.947)  # TerRIFIC curricula: "chunk cosine similarities all lie in ... 0.945 and 0.947"


def range_bootstrap(a: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    """max - min of the off-diagonal cosines of ``a`` and a percentile interval over chunks: each
    replicate redraws the chunk indices with replacement and keeps the pairs of two different
    drawn chunks (as :func:`spread_bootstrap`). A resample's range is at most the sample's, so the
    upper bound is the range itself: the interval says how much a few chunks drive it."""
    a = np.asarray(a, dtype=np.float64)
    n = a.shape[0]
    if a.ndim != 2 or a.shape[1] != n or n < 3:
        raise StrataInputError(f"a fidelity matrix of shape {a.shape}", fix="use a square matrix of fidelity_chunks >= 3 chunks")
    off = offdiagonal(a)
    est = float(off.max() - off.min())
    rng = np.random.default_rng(seed)
    iu, ju = np.triu_indices(n, 1)
    reps = np.full(n_boot, np.nan)
    for r in range(n_boot):
        idx = rng.integers(0, n, n)
        i, j = idx[iu], idx[ju]
        keep = i != j
        if keep.any():
            v = a[i[keep], j[keep]]
            reps[r] = v.max() - v.min()
    lo, hi = percentile_interval(reps[~np.isnan(reps)])
    return est, lo, hi


@claim("terrific_fidelity")
def fidelity_claims(data: ClaimData) -> list[Claim]:
    """TerRIFIC curricula's mixture fidelity: the cosines between the gradients of 10 consecutive
    chunks of the schedule, at a frozen checkpoint trained on non-overlapping data (the held-out
    split, ``gradient_analyses``), are tighter for greedy than for random. Strata's figure: the
    standard deviation of the off-diagonal cosines, greedy minus random; claimed < 0. Interval:
    paired bootstrap over chunks."""
    if not {"greedy", "random"} <= set(data.fidelity):
        raise MissingData("needs the fidelity matrices of greedy and random (materialize gradient_analyses)")
    g, r = data.fidelity["greedy"], data.fidelity["random"]
    mean, lo, hi = spread_bootstrap(g, r, data.n_boot, data.seed)
    og, orr = offdiagonal(g), offdiagonal(r)
    path = plot_fidelity_claim(g, r, data.figure("claim_fidelity"))
    p_lo, p_hi = FIDELITY_PAPER_RANGE
    common = dict(paper=TERRIFIC, figure=str(path),
                  paper_source="The Merits of Our Scheduler › Mixture Fidelity, Figure 5 (frozen checkpoint trained on non-overlapping "
                               "data)")
    width, w_lo, w_hi = range_bootstrap(g, data.n_boot, data.seed)
    return [Claim(
        key="terrific.fidelity.greedy_vs_random",
        claim="chunk-gradient cosines (mixture fidelity) are tighter for greedy than for random (Strata's recast: relative to random)",
        paper_figure=f"greedy's chunk cosines \"all lie in the incredibly tight range of {p_lo} and {p_hi}\" (spread {p_hi - p_lo:.3f})",
        value=mean, ci_low=lo, ci_high=hi, threshold=0.0, side="<",
        interval=f"paired bootstrap over {g.shape[0]} chunks", n=int(g.shape[0]),
        detail=f"std of off-diagonal cosines: greedy {og.std():.4f}, random {orr.std():.4f}; range greedy "
               f"[{og.min():.3f}, {og.max():.3f}], random [{orr.min():.3f}, {orr.max():.3f}]; the paper's absolute statement "
               f"is the row terrific.fidelity.greedy_range",
        **common,
    ), Claim(
        key="terrific.fidelity.greedy_range",
        claim=f"greedy's chunk-gradient cosines all lie in a range as tight as the paper's ({p_lo}-{p_hi}: width {p_hi - p_lo:.3f})",
        paper_figure=f"all in [{p_lo}, {p_hi}]: \"chunk cosine similarities all lie in the incredibly tight range of {p_lo} and {p_hi}\"",
        value=width, ci_low=w_lo, ci_high=w_hi, threshold=round(p_hi - p_lo, 6), side="<",
        interval=f"bootstrap over {g.shape[0]} chunks (pairs of two different drawn chunks)", n=int(g.shape[0]),
        detail=f"max - min of greedy's off-diagonal cosines: [{og.min():.4f}, {og.max():.4f}] (mean {og.mean():.4f}) against the "
               f"paper's [{p_lo}, {p_hi}]; random's [{orr.min():.4f}, {orr.max():.4f}]; inside the paper's interval: "
               f"{'yes' if og.min() >= p_lo and og.max() <= p_hi else 'no'} (the level depends on the model and the data)",
        **common,
    )]


# ---------------------------------------------------------------------------------------------
# Diversity-ordered training: the epoch-boundary anomaly (the claims' own multi-epoch runs)
# ---------------------------------------------------------------------------------------------

EPOCH_ARMS = ("topical", "stratified")  # a topical order (the paper's original order was one) and the diversity order
JUMP_SCHEMA = {"arm": pl.String, "seed": pl.Int64, "boundary": pl.Int64, "step": pl.Int64, "metric": pl.String, "ratio": pl.Float64}


def boundary_ratios(logs: pl.DataFrame) -> pl.DataFrame:
    """Jump ratio at every epoch boundary of every run: the metric at the first step of the new epoch
    over its mean in the last steps of the epoch before (``epoch_boundary_jumps`` with a one-step
    probe; the reference window is a tenth of an epoch, at least 5 steps). Columns of
    :data:`JUMP_SCHEMA`; ``logs`` has arm, seed, step, epoch, loss, grad_norm."""
    rows = []
    for (arm, seed), run in logs.group_by(["arm", "seed"], maintain_order=True):
        jumps = epoch_boundary_jumps(run.sort("step").to_dicts(), post=1)
        for j in jumps:
            rows.append({"arm": arm, "seed": int(seed), "boundary": j["epoch"], "step": j["boundary_step"],
                         "metric": j["metric"], "ratio": j["ratio"]})
    return pl.DataFrame(rows, schema=JUMP_SCHEMA)


def ratio_matrix(jumps: pl.DataFrame, arm: str, metric: str) -> np.ndarray:
    """(seeds x boundaries) jump ratios of one arm and metric."""
    sel = jumps.filter((pl.col("arm") == arm) & (pl.col("metric") == metric))
    if sel.height == 0:
        return np.zeros((0, 0))
    return (sel.sort("seed", "boundary").pivot(on="boundary", index="seed", values="ratio")
            .sort("seed").drop("seed").to_numpy().astype(np.float64))


def jump_table(jumps: pl.DataFrame, n_boot: int, seed: int) -> pl.DataFrame:
    """Mean jump ratio per arm and metric with its interval over seeds x boundaries."""
    rows = []
    for arm in jumps["arm"].unique(maintain_order=True).to_list():
        for metric in ("loss", "grad_norm"):
            m = ratio_matrix(jumps, arm, metric)
            if m.size:
                mean, lo, hi = interval_2way(m, n_boot, seed)
                rows.append({"arm": arm, "metric": metric, "ratio": mean, "ci_low": lo, "ci_high": hi,
                             "seeds": m.shape[0], "boundaries": m.shape[1]})
    return pl.DataFrame(rows, schema={"arm": pl.String, "metric": pl.String, "ratio": pl.Float64, "ci_low": pl.Float64,
                                      "ci_high": pl.Float64, "seeds": pl.Int64, "boundaries": pl.Int64})


@claim("dot_epoch_boundary")
def epoch_boundary_claims(data: ClaimData) -> list[Claim]:
    """Diversity-ordered training's epoch-boundary anomaly, on multi-epoch runs of a sample of the
    corpus in a topical order (grouped by source or cluster, like the paper's original order) and
    in the stratified (diversity) order (``claim_runs``): in the topical order the loss and the
    gradient norm jump when the stream restarts; in the diversity order they do not (less than in
    the topical one). Strata's figures: the jump ratio (the metric at the first step of the new
    epoch / its mean over the last steps before it), and the topical ratio minus the stratified
    one, paired by seed and boundary (both runs of a seed share the documents, the init and the
    learning-rate schedule, so the trend of the loss cancels). Interval: two-way bootstrap over
    seeds x boundaries. The per-order ratios are the table ``claims_epoch_jumps``."""
    logs = data.claim_log
    if logs is None or logs.filter(pl.col("experiment") == "epoch_boundary").height == 0:
        raise MissingData("needs the claims' multi-epoch runs (strata claims --full)")
    logs = logs.filter(pl.col("experiment") == "epoch_boundary")
    jumps = boundary_ratios(logs)
    if jumps.height == 0:
        raise MissingData("the epoch-boundary runs have no epoch boundary (claims_epochs >= 2)")
    table = jump_table(jumps, data.n_boot, data.seed)
    data.tables_out["claims_epoch_jumps"] = table
    path = str(plot_epoch_claim(logs, data.figure("claim_epoch_boundary")))
    how = ""
    arms = data.claim_arms
    if arms is not None and arms.height and "topic" in arms.columns:
        a = arms.filter((pl.col("experiment") == "epoch_boundary") & (pl.col("arm") == "topical"))
        if a.height:
            lo, hi = int(a["topic_groups"].min()), int(a["topic_groups"].max())
            epochs = int(logs["epoch"].max()) + 1
            how = (f"; topical order: the sample grouped by {a['topic'][0]} ({lo if lo == hi else f'{lo}-{hi}'} groups), "
                   f"{epochs} epochs of {int(a['steps'][0]) // epochs} steps")
    common = dict(paper=DOT, paper_source="the epoch-boundary anomaly (observed while fine-tuning)", figure=path)
    quotes = {"grad_norm": "≈4x (\"The gradient norm spikes to nearly 4x its normal value\")",
              "loss": "a jump (\"The loss drops sharply near the end of the first epoch ..., then spikes when it sees the beginning "
                      "again\")"}
    out = []
    for metric, label in (("grad_norm", "gradient norm"), ("loss", "loss")):
        m = ratio_matrix(jumps, "topical", metric)
        if m.size == 0:
            continue
        mean, lo, hi = interval_2way(m, data.n_boot, data.seed)
        out.append(Claim(
            key=f"dot.epoch_boundary.topical.{metric}", claim=f"in a topical order the {label} jumps at the epoch boundary",
            paper_figure=quotes[metric], value=mean, ci_low=lo, ci_high=hi, threshold=1.0, side=">",
            interval=f"two-way bootstrap over {m.shape[0]} seeds x {m.shape[1]} boundaries", n=int(m.size),
            detail=f"{label} at the first step of an epoch / its mean over the last steps before{how}", **common,
        ))
        s = ratio_matrix(jumps, "stratified", metric)
        if s.shape == m.shape and s.size:
            mean, lo, hi = interval_2way(m - s, data.n_boot, data.seed)
            out.append(Claim(
                key=f"dot.epoch_boundary.topical_minus_stratified.{metric}",
                claim=f"in the diversity (stratified) order the {label} does not jump (less than in the topical order)",
                paper_figure="no anomaly: \"Reordering the dataset so that each training sequence contains maximum topic "
                             "diversity eliminates epoch-boundary anomalies\"",
                value=mean, ci_low=lo, ci_high=hi, threshold=0.0, side=">",
                interval=f"two-way bootstrap over {m.shape[0]} seeds x {m.shape[1]} boundaries (paired)", n=int(m.size),
                detail=f"jump ratio topical minus stratified; stratified's own ratio {float(s.mean()):.3f}, "
                       f"topical's {float(m.mean()):.3f}",
                **common,
            ))
    return out


# ---------------------------------------------------------------------------------------------
# Packing & shuffling: padding vs concat, and the atom size (the claims' own runs)
# ---------------------------------------------------------------------------------------------


def paired_units(units: pl.DataFrame, a: str, b: str) -> np.ndarray:
    """(seeds x held-out documents) loss of arm ``a`` minus arm ``b`` (cells both have)."""
    pa = units.filter(pl.col("arm") == a).select("seed", "unit", la="loss")
    pb = units.filter(pl.col("arm") == b).select("seed", "unit", lb="loss")
    d = pa.join(pb, on=["seed", "unit"], how="inner").with_columns(d=pl.col("la") - pl.col("lb"))
    if d.height == 0:
        return np.zeros((0, 0))
    m = d.sort("seed", "unit").pivot(on="unit", index="seed", values="d").sort("seed").drop("seed").to_numpy().astype(np.float64)
    return m[:, ~np.isnan(m).any(axis=0)]


def _ppl(units: pl.DataFrame, arm: str) -> float:
    return float(np.exp(units.filter(pl.col("arm") == arm)["loss"].mean()))


@claim("packing")
def packing_claims(data: ClaimData) -> list[Claim]:
    """Packing & shuffling: padding reaches a lower perplexity than concat at equal (non-padding)
    tokens, and with documents longer than seq_len an atom of seq_len beats 0.5x and 2x seq_len.
    Runs of ``claim_runs`` (plain causal attention over the whole sequence, as the paper trains),
    scored on the fixed held-out batch. Strata's figure: the difference of held-out loss
    (nats/token; claimed < 0), perplexities in the detail. Interval: two-way bootstrap over seeds x
    held-out documents."""
    units = data.claim_heldout
    if units is None or units.filter(pl.col("experiment") == "packing").height == 0:
        if data.claim_sequences is not None and data.claim_sequences.filter(pl.col("experiment") == "packing_epochs").height:
            return []  # the packing runs are in the paper's protocol (packing_paper_protocol's rows)
        raise MissingData("needs the claims' packing runs at equal tokens "
                          "(strata claims --full with claims_packing_protocol: equal_tokens)")
    units = units.filter(pl.col("experiment") == "packing")
    arms = data.claim_arms.filter(pl.col("experiment") == "packing") if data.claim_arms is not None else None
    path = str(plot_packing_claim(units, data.figure("claim_packing")))
    note = ""
    if arms is not None and arms.height:
        doc, seq_len = float(arms["mean_doc_tokens"][0]), int(arms["seq_len"][0])
        note = f"; mean document {doc:.0f} tokens vs seq_len {seq_len}" + ("" if doc > seq_len
                                                                           else " (the claim's condition does not hold)")
    steps = dict(arms.group_by("arm").agg(pl.col("steps").first()).iter_rows()) if arms is not None and arms.height else {}
    out = []
    specs = [("padding-x1", "concat-x1", "padding reaches a lower perplexity than concat at equal tokens",
              "lower by 5-24% (Table 3; MSL 64: 99.79 vs 110.45)", "Table 3 (GPT-2 124M, WikiText)")]
    for other in ("concat-x0.5", "concat-x2", "concat-x0.25", "concat-x4"):
        if other in set(units["arm"]):
            specs.append(("concat-x1", other, f"atom size = seq_len beats {other.split('-x')[1]} x seq_len (documents longer than seq_len)",
                          {"concat-x0.5": "118.08 vs 157.39", "concat-x2": "118.08 vs 119.66", "concat-x0.25": "118.08 vs 207.04",
                           "concat-x4": "118.08 vs 121.18"}[other] + " (concat, MSL 64)", "Table 2 (concat, MSL 64)"))
    for a, b, text, quote, source in specs:
        d = paired_units(units, a, b)
        if d.size == 0:
            continue
        mean, lo, hi = interval_2way(d, data.n_boot, data.seed)
        out.append(Claim(
            key=f"packing.{a}_vs_{b}", paper=PACKING, claim=text, paper_figure=f"final perplexity {quote}", paper_source=source,
            value=mean, ci_low=lo, ci_high=hi, threshold=0.0, side="<",
            interval=f"two-way bootstrap over {d.shape[0]} seeds x {d.shape[1]} held-out documents", n=int(d.size),
            detail=f"held-out loss {a} minus {b} (nats/token); perplexity {_ppl(units, a):.1f} vs {_ppl(units, b):.1f}"
                   f" after {steps.get(a, '?')} vs {steps.get(b, '?')} steps{note}",
            figure=path,
        ))
    return out


PACKING_QUOTES = {"concat-x0.5": "118.08 vs 157.39", "concat-x2": "118.08 vs 119.66", "concat-x0.25": "118.08 vs 207.04",
                  "concat-x4": "118.08 vs 121.18"}
PACKING_RANKS = {"concat-x0.25": 5.00, "concat-x0.5": 4.00, "concat-x1": 1.05, "concat-x2": 1.96, "concat-x4": 2.99}  # Table 2, concat


def slice_log_perplexity(seqs: pl.DataFrame, n_slices: int = 100) -> pl.DataFrame:
    """Packing & shuffling's Appendix A.6 on per-sequence training losses: each run's last epoch cut
    into ``n_slices`` slices by the sequence's position in the epoch (slice = floor(index x n /
    epoch_size), each 1/n of the epoch), and each slice's log perplexity = its summed loss / its
    tokens (the token-weighted mean loss). ``seqs``: arm, seed, epoch, index, epoch_size,
    loss_sum, tokens. Returns arm, seed, slice, log_ppl; every slice must hold a sequence."""
    last = seqs.group_by("arm", "seed").agg(pl.col("epoch").max().alias("last"))
    s = (seqs.join(last, on=["arm", "seed"]).filter(pl.col("epoch") == pl.col("last"))
         .with_columns(slice=(pl.col("index") * n_slices // pl.col("epoch_size")).cast(pl.Int64)))
    out = (s.group_by("arm", "seed", "slice").agg(log_ppl=pl.col("loss_sum").sum() / pl.col("tokens").sum())
           .sort("arm", "seed", "slice"))
    counts = out.group_by("arm", "seed").len()
    if counts.height and int(counts["len"].min()) < n_slices:
        raise StrataInputError(f"a run's last epoch fills {int(counts['len'].min())} of {n_slices} slices",
                               fix="train at least as many sequences per epoch as slices (raise claims_packing_sequences)")
    return out


def slice_matrix(lp: pl.DataFrame, arm: str) -> tuple[list[int], np.ndarray]:
    """(seeds, seeds x slices log perplexity) of one arm."""
    sel = lp.filter(pl.col("arm") == arm)
    if sel.height == 0:
        return [], np.zeros((0, 0))
    wide = sel.pivot(on="slice", index="seed", values="log_ppl").sort("seed")
    return wide["seed"].to_list(), wide.drop("seed").to_numpy().astype(np.float64)


def mean_ranks(lp: pl.DataFrame, arms: list[str]) -> dict[str, float]:
    """The paper's perplexity ranking: in every (seed, slice) the arms ranked by slice perplexity
    (1 = lowest), averaged over slices and seeds."""
    sel = lp.filter(pl.col("arm").is_in(arms)).with_columns(rank=pl.col("log_ppl").rank("average").over("seed", "slice"))
    return dict(sel.group_by("arm").agg(pl.col("rank").mean()).iter_rows())


@claim("packing_paper_protocol")
def packing_protocol_claims(data: ClaimData) -> list[Claim]:
    """Packing & shuffling in the paper's protocol (``claims_packing_protocol: paper``): every arm
    trains 2 epochs over its own packing of the same documents, at an MSL below the mean document
    length; the last epoch is cut into 100 slices of 1% (Appendix A.6). Two rows per comparison
    (padding vs concat at atom = MSL; atom = MSL vs each other atom, concat):

    - *final perplexity*: the last slice's (0.99-1.00 of the last epoch) log perplexity, a minus b,
      mean over seeds; claimed < 0. Interval: bootstrap over seeds (the only independent unit).
    - *ranking over the 100 slices*: the fraction of (seed, slice) cells in which a's slice
      perplexity is below b's; claimed > 0.5. Interval: two-way bootstrap over seeds x slices
      (neighbouring slices of one run are correlated, so it is narrower than seeds alone would
      give). The paper's average rankings among all arms are in the detail beside Strata's.
    """
    seqs = data.claim_sequences
    if seqs is None or seqs.filter(pl.col("experiment") == "packing_epochs").height == 0:
        raise MissingData("needs the claims' packing runs in the paper's protocol (strata claims --full; claims_packing_protocol: paper)")

    seqs = seqs.filter(pl.col("experiment") == "packing_epochs")
    lp = slice_log_perplexity(seqs)
    path = str(plot_packing_protocol_claim(lp, data.figure("claim_packing_protocol")))
    arms = data.claim_arms.filter(pl.col("experiment") == "packing_epochs") if data.claim_arms is not None else None
    note = ""
    if arms is not None and arms.height:
        doc, msl = float(arms["mean_doc_tokens"].mean()), int(arms["seq_len"][0])
        epochs = int(seqs["epoch"].max()) + 1
        note = (f"; {epochs} epochs at MSL {msl}, mean document {doc:.0f} tokens"
                + ("" if doc > msl else " (the paper's condition, mean document length > MSL, does not hold)"))
    present = set(lp["arm"])
    concat = sorted((a for a in present if a.startswith("concat-x")), key=lambda a: float(a.split("-x")[1]))
    ranks = mean_ranks(lp, concat)
    rank_note = "; mean rank among " + ", ".join(f"{a.split('-x')[1]}x {ranks[a]:.2f}"
                                                 + (f" [paper {PACKING_RANKS[a]:.2f}]" if a in PACKING_RANKS else "")
                                                 for a in concat)
    specs = [("padding-x1", "concat-x1", "padding reaches a lower final perplexity than concat (atom = MSL)",
              "lower by 5-24% (Table 3; MSL 64: 99.79 vs 110.45)", "Table 3; Appendix A.6 (final perplexity, 2 epochs)")]
    specs += [("concat-x1", o, f"atom size = MSL beats {o.split('-x')[1]} x MSL (concat; documents longer than the MSL)",
               PACKING_QUOTES.get(o, "lower") + " (concat, MSL 64)", "Table 2; Appendix A.6 (final perplexity and ranking, 2 epochs)")
              for o in concat if o != "concat-x1"]
    out = []
    for a, b, text, quote, source in specs:
        sa, ma = slice_matrix(lp, a)
        sb, mb = slice_matrix(lp, b)
        if sa != sb or ma.size == 0:
            continue
        final = (ma[:, -1] - mb[:, -1])[:, None]
        mean, lo, hi = interval_2way(final, data.n_boot, data.seed)
        ppl = f"final perplexity {math.exp(ma[:, -1].mean()):.1f} vs {math.exp(mb[:, -1].mean()):.1f} (geometric mean over seeds)"
        out.append(Claim(
            key=f"packing.paper.final.{a}_vs_{b}", paper=PACKING,
            claim=f"{text}: final perplexity, last 1% of epoch {int(seqs['epoch'].max()) + 1}",
            paper_figure=f"final perplexity {quote}", paper_source=source, value=mean, ci_low=lo, ci_high=hi, threshold=0.0, side="<",
            interval=f"bootstrap over {len(sa)} seeds", n=len(sa),
            detail=f"log perplexity of the last slice (0.99-1.00 of the last epoch), {a} minus {b}; {ppl}{note}", figure=path,
        ))
        below = (ma < mb).astype(np.float64)
        mean, lo, hi = interval_2way(below, data.n_boot, data.seed)
        out.append(Claim(
            key=f"packing.paper.rank.{a}_vs_{b}", paper=PACKING, claim=f"{text}: ranked over the last epoch's 100 slices",
            paper_figure=("perplexity ranking 1.05 (1 MSL) of 5 atoms (Table 2)" if b != "concat-x1" and a == "concat-x1"
                          else "lower final perplexity (Figure 3: padding below concat through the last epoch)"),
            paper_source=source, value=mean, ci_low=lo, ci_high=hi, threshold=0.5, side=">",
            interval=f"two-way bootstrap over {len(sa)} seeds x {ma.shape[1]} slices", n=int(below.size),
            detail=f"fraction of (seed, slice) cells with {a}'s slice perplexity below "
                   f"{b}'s{rank_note if a.startswith('concat') else ''}{note}",
            figure=path,
        ))
    if not out:
        raise MissingData("the paper-protocol packing runs share no seed between the compared arms")
    return out


# ---------------------------------------------------------------------------------------------
# The report section
# ---------------------------------------------------------------------------------------------


def _interval(r: dict) -> str:
    return f"{_fmt(r['value'], 4)} [{_fmt(r['ci_low'], 4)}, {_fmt(r['ci_high'], 4)}]"


def claims_section(claims: pl.DataFrame | None, diversity: pl.DataFrame | None = None, jumps: pl.DataFrame | None = None,
                   missing: Mapping[str, str] | None = None, base: Path | None = None,
                   root: Path | None = None) -> tuple[str, dict[str, Path]]:
    """The ablation report's claims section: ``(markdown, {figure name: PNG path})``.

    ``claims``: the ``claims`` table; ``diversity``: ``claims_diversity``; ``jumps``:
    ``claims_epoch_jumps``; ``missing``: claims not measured and why. Image links are relative to
    ``base`` (the report's folder) when given, else absolute; the figures dict is for the UI.
    """
    lines = ["## Claims of the papers, reproduced on this corpus", ""]
    if claims is None or claims.height == 0:
        lines.append("No claim was measured (materialize `claims`, or run `strata claims`).")
        return "\n".join(lines) + "\n", {}
    lines += [
        "Each row: the paper's claim, its own figure (quoted), Strata's figure with a 95% interval, and the verdict "
        "the interval decides — *reproduced* when it lies wholly on the claimed side of the threshold, *not reproduced* "
        "when wholly on the other, else *inconclusive*. `strata claims` prints the same table; DuckDB `claims` holds it "
        "with the interval's method, the units and the details.",
        "",
    ]
    lines += table_lines(["paper", "claim", "paper's figure", "Strata [95% CI]", "claimed", "verdict"],
                         [[r["paper"], r["claim"], r["paper_figure"].split(" (\"")[0].split(": \"")[0], _interval(r),
                           f"{r['side']} {_fmt(r['threshold'])}", f"**{r['verdict']}**"] for r in claims.iter_rows(named=True)])
    if missing:
        lines += ["", "Not measured here: " + "; ".join(f"`{k}` ({v})" for k, v in missing.items()) + "."]
    if diversity is not None and diversity.height:
        k = int(diversity["k"][0])
        lines += [
            "", f"### Diversity-ordered training's table on this corpus (k={k})", "",
            "Distinct clusters per sequence (the paper's table, its values in brackets: 131K-token sequences, k=30) and, "
            "beside it, the per-batch token-share deviation max_k |share in the batch − global share|: stratified "
            "balances document *counts*, so with many short and few long documents its batches miss the token shares.",
            "",
        ]
        rows = []
        for r in diversity.iter_rows(named=True):
            p = ((f" [{r['paper_mean']:g}]", f" [{r['paper_min']:g}]", f" [{r['paper_std']:g}]")
                 if r["paper_mean"] is not None else ("", "", ""))
            rows.append([r["strategy"], str(r["sequences"]), f"{r['clusters_per_seq_mean']:.3f}{p[0]}",
                         f"{r['clusters_per_seq_min']:.0f}{p[1]}",
                         f"{r['clusters_per_seq_std']:.3f}{p[2]}", f"{r['batch_token_share_dev_mean']:.4f}",
                         f"{r['batch_token_share_dev_max']:.4f}"])
        lines += table_lines(["strategy", "sequences", "mean", "min", "std", "batch token-share dev. (mean)", "(max)"], rows, "lrrrrrr")
    if jumps is not None and jumps.height:
        lines += ["", "### Epoch-boundary jump ratio per order (mean over seeds x boundaries, 95% interval)", ""]
        lines += table_lines(["order", "metric", "jump ratio [95% CI]", "seeds", "boundaries"],
                             [[r["arm"], r["metric"], f"{_fmt(r['ratio'], 4)} [{_fmt(r['ci_low'], 4)}, {_fmt(r['ci_high'], 4)}]",
                               str(r["seeds"]), str(r["boundaries"])] for r in jumps.iter_rows(named=True)], "lllrr")
    figures: dict[str, Path] = {}
    for f in claims["figure"].unique(maintain_order=True).to_list():
        if f:  # stored relative to the data root (``root``; default ``base``)
            p = Path(f)
            figures[p.stem] = p if p.is_absolute() or (root or base) is None else (root or base) / p
    lines += [""]
    for name, p in figures.items():
        shown = p.relative_to(base) if base is not None and p.is_relative_to(base) else p
        lines.append(f"![{name}]({shown})")
    return "\n".join(lines) + "\n", figures


CLAIM_TABLES = ("claims", "claims_diversity", "claims_epoch_jumps", "claims_not_measured")


def claims_report_section(read: Callable[[str], pl.DataFrame | None], base: Path | None = None) -> tuple[str, dict[str, Path]]:
    """:func:`claims_section` from the warehouse: ``read(name)`` returns a DuckDB table (None when
    absent) among :data:`CLAIM_TABLES`. The one call the ablation report makes."""
    missing = read("claims_not_measured")
    return claims_section(read("claims"), read("claims_diversity"), read("claims_epoch_jumps"),
                          dict(missing.select("claim", "reason").iter_rows()) if missing is not None else None, base)
