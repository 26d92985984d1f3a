"""Diversity-ordered training's claims: its four-strategy table (the stratified order's distinct
clusters per sequence against the original order, round-robin and bin-packing), and the
epoch-boundary anomaly (a topical order's loss and gradient norm jump where the stream restarts, a
diversity order's do not)."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import polars as pl

from pipeline.claims.measure import Claim, ClaimData, MissingData, interval_2way, mean_replicates, percentile_interval
from pipeline.claims.papers import ClaimSpec
from pipeline.claims.plots import plot_diversity_claim, plot_epoch_claim
from pipeline.reports import diagnostics as D
from pipeline.training.loop import epoch_boundary_jumps

DOT = "Diversity-ordered training"


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


def _topical_order(arms: pl.DataFrame | None, logs: pl.DataFrame) -> str:
    """How the runs' topical order was made, for the rows' detail: what the sample was grouped by,
    into how many groups, and the epochs and their steps ("" when the arms do not say)."""
    if arms is not None and arms.height and "topic" in arms.columns:
        a = arms.filter((pl.col("experiment") == "epoch_boundary") & (pl.col("arm") == "topical"))
        if a.height:
            lo, hi = int(a["topic_groups"].min()), int(a["topic_groups"].max())
            epochs = int(logs["epoch"].max()) + 1
            return (f"; topical order: the sample grouped by {a['topic'][0]} ({lo if lo == hi else f'{lo}-{hi}'} groups), "
                    f"{epochs} epochs of {int(a['steps'][0]) // epochs} steps")
    return ""


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
    how = _topical_order(data.claim_arms, logs)
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

SPECS = (
    ClaimSpec("dot_diversity_table", DOT, "the stratified order has more distinct clusters per sequence than the original, "
              "round-robin and bin-packing orders", diversity_claims, reads=("claims.k", "batch_size"),
              inputs=("diversity", "diversity_k", "batch_size"), order=60),
    ClaimSpec("dot_epoch_boundary", DOT, "a topical order's loss and gradient norm jump at the epoch boundary, the stratified "
              "order's do not", epoch_boundary_claims, inputs=("claim_log", "claim_arms"), order=80),
)
