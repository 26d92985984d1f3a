"""Figures of the ablation runs (PNG), one function per picture.

Loss curves per strategy (mean +- std band over seeds), ODM's mixture over time, stable rank per
layer, and the 10 x 10 mixture-fidelity heatmaps. Built on ``matplotlib.figure.Figure`` (Agg, no
pyplot state); every function writes its file atomically and returns its path. Inputs are the tidy
frames the library produces (``train`` log rows, ``ODMSampler.mixture_rows``,
``gradients.summarize_stable_ranks``, fidelity matrices).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.render.figures import cluster_colors, need_columns, new_figure, save_png


def _smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average (the first points average what exists so far)."""
    if window <= 1 or y.size == 0:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    n = np.minimum(np.arange(1, y.size + 1), window)
    return (c[1:] - c[np.maximum(0, np.arange(1, y.size + 1) - n)]) / n


def plot_loss_curves(log: pl.DataFrame, path: str | os.PathLike, metric: str = "loss", smooth: int | None = None) -> Path:
    """Overlaid training curves per strategy; with several seeds the mean and a +-1 std band.

    ``log`` has columns ``strategy, step, <metric>`` and optionally ``seed``. ``smooth`` is a
    trailing moving-average window (default: 2% of the steps), applied per run before averaging.
    """
    need_columns(log, ("strategy", "step", metric), "loss curves")
    if "seed" not in log.columns:
        log = log.with_columns(seed=pl.lit(0))
    strategies = sorted(log["strategy"].unique().to_list())
    colors = cluster_colors(max(len(strategies), 1))
    fig = new_figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    n_steps = int(log["step"].max()) + 1
    w = smooth if smooth is not None else max(1, n_steps // 50)
    for color, s in zip(colors, strategies):
        runs = log.filter(pl.col("strategy") == s).sort("step")
        curves = []
        for (_,), run in runs.group_by(["seed"], maintain_order=True):
            curves.append((run["step"].to_numpy(), _smooth(run[metric].to_numpy().astype(np.float64), w)))
        steps = np.unique(np.concatenate([c[0] for c in curves]))
        ys = np.array([np.interp(steps, x, y, left=np.nan, right=np.nan) for x, y in curves])
        mean = np.nanmean(ys, axis=0)
        label = s if len(curves) == 1 else f"{s} (n={len(curves)} seeds)"
        ax.plot(steps, mean, color=color, lw=1.6, label=label)
        if len(curves) > 1:
            sd = np.nanstd(ys, axis=0, ddof=1)
            ax.fill_between(steps, mean - sd, mean + sd, color=color, alpha=0.2, lw=0)
    ax.set_xlabel("step")
    ax.set_ylabel(metric.replace("_", " ") + (f" (moving avg, {w} steps)" if w > 1 else ""))
    ax.set_title(f"Training {metric.replace('_', ' ')} per strategy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_png(fig, path)


def plot_heldout_curves(curve: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Held-out loss vs tokens seen per strategy: mean over seeds, band = min..max over seeds.

    ``curve``: strategy, seed, step, tokens_seen, unit, loss (the fixed held-out batch, scored
    every N steps; a run's value is the mean over the held-out documents). Two panels: the whole
    run, and the last half with its own y range, where the strategies differ.
    """
    need_columns(curve, ("strategy", "seed", "step", "tokens_seen", "loss"), "held-out curves")
    runs = curve.group_by("strategy", "seed", "step").agg(pl.col("tokens_seen").first(), pl.col("loss").mean()).sort("step")
    strategies = sorted(runs["strategy"].unique().to_list())
    colors = cluster_colors(max(len(strategies), 1))
    fig = new_figure(figsize=(11, 4.5))
    axes = fig.subplots(1, 2)
    half = float(runs["tokens_seen"].max()) / 2
    for ax, lo in zip(axes, (0.0, half)):
        for color, s in zip(colors, strategies):
            r = runs.filter(pl.col("strategy") == s)
            agg = (r.group_by("step").agg(pl.col("tokens_seen").mean(), pl.col("loss").mean().alias("m"),
                                         pl.col("loss").min().alias("lo"), pl.col("loss").max().alias("hi"),
                                         pl.col("seed").n_unique().alias("n")).sort("step").filter(pl.col("tokens_seen") >= lo))
            x = agg["tokens_seen"].to_numpy() / 1e3
            n = int(agg["n"].max()) if agg.height else 0
            ax.plot(x, agg["m"].to_numpy(), color=color, lw=1.6, marker="o", ms=3, label=f"{s} ({n} seeds)")
            if n > 1:
                ax.fill_between(x, agg["lo"].to_numpy(), agg["hi"].to_numpy(), color=color, alpha=0.18, lw=0)
        ax.set_xlabel("tokens seen (thousands)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out loss (nats/token)")
    axes[0].set_title("Fixed held-out batch, every strategy (band: seed min-max)")
    axes[1].set_title("second half of training")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return save_png(fig, path)


def plot_mixture(mixture: pl.DataFrame, path: str | os.PathLike, title: str = "ODM mixture over training") -> Path:
    """Stacked area of the sampling probability of every cluster per step (``step, cluster, prob``)."""
    need_columns(mixture, ("step", "cluster", "prob"), "mixture")
    wide = mixture.pivot(on="cluster", index="step", values="prob", sort_columns=True).sort("step").fill_null(0.0)
    clusters = [c for c in wide.columns if c != "step"]
    clusters.sort(key=int)
    steps = wide["step"].to_numpy()
    probs = np.stack([wide[c].to_numpy() for c in clusters])
    fig = new_figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    ax.stackplot(steps, probs, colors=cluster_colors(len(clusters)), labels=[f"cluster {c}" for c in clusters], lw=0)
    ax.set_xlim(steps.min(), steps.max())
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("sampling probability")
    ax.set_title(title)
    if len(clusters) <= 20:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save_png(fig, path)


def _checkpoint_key(c) -> tuple:
    """Numeric order for checkpoints given as steps or "20%" labels, text order otherwise."""
    try:
        return (0, float(str(c).rstrip("%")), "")
    except ValueError:
        return (1, 0.0, str(c))


def plot_stable_ranks(summary: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Min and mean stable rank per layer matrix, one line per strategy, one row per checkpoint.

    ``summary`` is :func:`pipeline.training.gradients.summarize_stable_ranks` output with a ``strategy``
    column (and ``checkpoint``; several seeds are averaged).
    """
    need_columns(summary, ("strategy", "layer_name", "layer", "min_stable_rank", "mean_stable_rank"), "stable ranks")
    if "checkpoint" not in summary.columns:
        summary = summary.with_columns(checkpoint=pl.lit("final"))
    agg = summary.group_by(["checkpoint", "strategy", "layer_name", "layer", "block", "matrix"]).agg(
        pl.col("min_stable_rank").mean(), pl.col("mean_stable_rank").mean()
    )
    rank = {m: i for i, m in enumerate(("q", "k", "v", "o", "gate", "up", "down"))}
    names = agg.select("layer_name", "layer", "matrix").unique().rows()
    names.sort(key=lambda r: (r[1], rank.get(r[2], len(rank)), r[0]))
    order = {n: i for i, (n, _, _) in enumerate(names)}
    checkpoints = sorted(agg["checkpoint"].unique().to_list(), key=_checkpoint_key)
    strategies = sorted(agg["strategy"].unique().to_list())
    colors = cluster_colors(len(strategies))
    fig = new_figure(figsize=(max(8, 0.35 * len(order) + 3), 3.2 * len(checkpoints) + 0.6))
    axes = fig.subplots(len(checkpoints), 2, squeeze=False)
    for r, ck in enumerate(checkpoints):
        for c, (col, label) in enumerate((("min_stable_rank", "min"), ("mean_stable_rank", "mean"))):
            ax = axes[r, c]
            for color, s in zip(colors, strategies):
                d = agg.filter((pl.col("checkpoint") == ck) & (pl.col("strategy") == s))
                x = np.array([order[n] for n in d["layer_name"]])
                o = np.argsort(x)
                ax.plot(x[o], d[col].to_numpy()[o], "o-", ms=3, lw=1.2, color=color, label=s)
            ax.set_xticks(range(len(order)))
            ax.set_xticklabels([n.replace("layers.", "L").replace(".attention.", " ").replace(".mlp.", " ") for n in order], rotation=90,
                               fontsize=7)
            ax.set_ylabel("stable rank")
            ax.set_title(f"{label} stable rank of batch gradients — checkpoint {ck}", fontsize=9)
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return save_png(fig, path)


def plot_fidelity(matrices: Mapping[str, np.ndarray], path: str | os.PathLike) -> Path:
    """One cosine-similarity heatmap of chunk gradients per strategy (TerRIFIC curricula, fig. 5).

    The colour scale is shared across strategies and spans their off-diagonal range, so a drifting
    schedule stands out; every cell is annotated for matrices up to 12 x 12.
    """
    if not matrices:
        raise StrataInputError("no fidelity matrices to plot", fix="pass {strategy: matrix}")
    names = sorted(matrices)
    off = np.concatenate([np.asarray(matrices[n])[~np.eye(len(matrices[n]), dtype=bool)] for n in names])
    lo, hi = float(off.min()), float(off.max())
    if hi - lo < 1e-6:
        lo, hi = lo - 0.005, hi + 0.005
    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig = new_figure(figsize=(4.2 * cols + 0.8, 3.9 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    im = None
    for ax, n in zip(axes.ravel(), names):
        m = np.asarray(matrices[n])
        im = ax.imshow(m, vmin=lo, vmax=hi, cmap="viridis")
        k = m.shape[0]
        ax.set_xticks(range(k))
        ax.set_yticks(range(k))
        ax.tick_params(labelsize=7)
        ax.set_xlabel("chunk")
        ax.set_ylabel("chunk")
        ax.set_title(f"{n}: off-diag {m[~np.eye(k, dtype=bool)].min():.3f}–{m[~np.eye(k, dtype=bool)].max():.3f}", fontsize=9)
        if k <= 12:
            for i in range(k):
                for j in range(k):
                    v = m[i, j]
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=5.5,
                            color="black" if v > lo + 0.6 * (hi - lo) else "white")
    for ax in axes.ravel()[len(names):]:
        ax.set_visible(False)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="cosine similarity")
    fig.suptitle("Mixture fidelity: cosine similarity of chunk gradients", fontsize=11)
    return save_png(fig, path)
