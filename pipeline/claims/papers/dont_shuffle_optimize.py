"""Don't Shuffle, Optimize's claims: greedy's prefix error below random's at every prefix, the data's
characteristics constant throughout training, the worst greedy batch more diverse than the best
random batch, and greedy's batch gradients of higher stable rank than random's."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from pipeline.claims.measure import Claim, ClaimData, MissingData, interval_2way, percentile_interval
from pipeline.claims.papers import ClaimSpec
from pipeline.claims.plots import plot_prefix_claim, plot_stable_rank_claim, plot_stationarity_claim, plot_worst_best_claim
from pipeline.errors import StrataInputError
from pipeline.reports import diagnostics as D
from pipeline.reports import stationarity as S
from pipeline.reports.claims_section import fmt

DSO = "Don't Shuffle, Optimize"
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
                   f"{fmt(float(np.median(g / np.maximum(np.median(r, axis=0), 1e-300))))}{where}",
        ))
    path = plot_prefix_claim(t, curves, data.figure("claim_prefix_error"))
    return [Claim(**{**c.__dict__, "figure": str(path)}) for c in out]


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
            detail=f"greedy's worst batch deviates {fmt(float(g.max()))}, random's best {fmt(float(np.median(best)))} "
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


SPECS = (
    ClaimSpec("dso_prefix_error", DSO, "greedy's prefix error is below random's at every prefix (clusters, length bins)",
              prefix_error_claims, reads=("claims.shuffles", "length_bins"), inputs=("schedule", "random_positions"), order=10),
    ClaimSpec("dso_stationarity", DSO, "every characteristic of the data trained on stays inside random's band throughout training",
              stationarity_claims, reads=("claims.shuffles", "length_bins", "max_steps", "batch_size"),
              inputs=("schedule", "random_positions", "prefix"), order=20),
    ClaimSpec("dso_worst_vs_best_batch", DSO, "the worst greedy batch is more diverse than the best random batch",
              worst_best_claims, reads=("claims.shuffles", "length_bins", "batch_size"),
              inputs=("schedule", "random_positions", "batch_size"), order=30),
    ClaimSpec("dso_stable_rank", DSO, "greedy's batch gradients have a higher stable rank than random's (attention, MLP)",
              stable_rank_claims, reads=("seeds",), inputs=("stable_rank",), order=40),
)
