"""TerRIFIC curricula's claims: the ordered stream's worst batch gradient of higher stable rank than
shuffling's, and its chunk gradients' cosines (mixture fidelity) tight, tighter than random's."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from pipeline.claims.measure import Claim, ClaimData, MissingData, percentile_interval
from pipeline.claims.papers import ClaimSpec
from pipeline.claims.plots import plot_fidelity_claim, plot_min_stable_rank_claim
from pipeline.errors import StrataInputError
from pipeline.reports.claims_section import fmt
from pipeline.reports.stats import offdiagonal

TERRIFIC = "TerRIFIC curricula"


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
                       f"{fmt(float(np.median(mins_a)))}, random {fmt(float(np.median(mins_b)))}",
            ))
    if not out:
        raise MissingData("the greedy and random runs share fewer than 2 probe batches")
    path = plot_min_stable_rank_claim(cells, data.figure("claim_min_stable_rank"))
    return [Claim(**{**c.__dict__, "figure": str(path)}) for c in out]


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

SPECS = (
    ClaimSpec("terrific_min_stable_rank", TERRIFIC, "greedy's worst batch gradient has a higher stable rank than random's",
              min_stable_rank_claims, reads=("seeds",), inputs=("stable_rank",), order=50),
    ClaimSpec("terrific_fidelity", TERRIFIC, "chunk-gradient cosines (mixture fidelity) are tight for greedy, tighter than random's",
              fidelity_claims, inputs=("fidelity",), order=70),
)
