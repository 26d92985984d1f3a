"""Figures of the claims (PNG), one per claim (the paper modules of ``pipeline.claims.papers``).

Each shows the quantity the claim's verdict is computed from: both orders' prefix errors, the
batch deviations with greedy's worst and random's best batch marked, the paired stable-rank log
ratios per probe batch, the diversity table beside the token-share deviation, the two fidelity
matrices, the training curves around the epoch boundaries, and the held-out loss per packing.
``matplotlib.figure.Figure`` only (no pyplot state); files are written atomically.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import numpy as np
import polars as pl

from pipeline.heavy import lazy
from pipeline.render.figures import new_figure, save_png
from pipeline.reports.stats import offdiagonal

ticker = lazy("matplotlib.ticker")  # imported when the first figure is drawn (pipeline/heavy.py)

GREEDY, RANDOM, OTHER = "#1f77b4", "#d62728", "#7f7f7f"


def _log_x(ax) -> None:
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%.3g"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def plot_prefix_claim(t: np.ndarray, curves: Mapping[str, tuple[np.ndarray, np.ndarray]], path: str | os.PathLike) -> Path:
    """Prefix error against prefix length, log-log (Don't Shuffle, Optimize's chart): greedy's curve
    over each random shuffle's own curve (thin) and their median; prefixes where greedy is not
    below every shuffle are marked. A prefix error of 0 sits at the axis floor (no 0 on a log axis)."""
    fig = new_figure(figsize=(12, 4.6))
    axes = fig.subplots(1, 2)
    for ax, (kind, (g, r)) in zip(axes, curves.items()):
        r = np.atleast_2d(r)
        every = np.r_[g, r.ravel()]
        floor = 0.5 * float(every[every > 0].min()) if (every > 0).any() else 1e-12
        if (every <= 0).any():
            ax.axhline(floor, color=OTHER, lw=0.8, ls=":", label="error 0 (drawn at this floor)")
        for i, curve in enumerate(r):
            ax.plot(t, np.maximum(curve, floor), color=RANDOM, lw=0.7, alpha=0.35, label=f"random: each of {r.shape[0]} shuffles" if i == 0
                    else None)
        ax.plot(t, np.maximum(np.median(r, axis=0), floor), color=RANDOM, lw=1.4, ls="--", label="random: median")
        ax.plot(t, np.maximum(g, floor), color=GREEDY, lw=2.0, label="greedy")
        lost = (g[None, :] >= r).any(axis=0)
        if lost.any():
            ax.scatter(t[lost], np.maximum(g[lost], floor), color="black", s=14, zorder=5, label="greedy not below every shuffle")
        frac = float((g[None, :] < r).mean())
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"prefix length t (sequences; {t.size} prefixes of the whole ordering)")
        ax.set_ylabel("||T(t) − share·S(t)|| / S(t)")
        ax.set_title(f"{kind.replace('_', ' ')}: greedy below in {frac:.1%} of (shuffle, prefix) pairs", fontsize=10)
        ax.grid(alpha=0.3, which="major")
        ax.grid(alpha=0.1, which="minor")
        ax.legend(fontsize=8)
    fig.suptitle("Don't Shuffle, Optimize: prefix error, greedy vs random", fontsize=11)
    fig.tight_layout()
    return save_png(fig, path)


def plot_worst_best_claim(devs: Mapping[str, tuple[np.ndarray, list[np.ndarray]]], batch_size: int, path: str | os.PathLike) -> Path:
    """Per-batch token-share deviation of greedy and of the random shuffles (pooled), with greedy's
    worst batch and each shuffle's best batch marked."""
    fig = new_figure(figsize=(12, 4.4))
    axes = fig.subplots(1, 2)
    for ax, (kind, (g, r)) in zip(axes, devs.items()):
        pooled = np.concatenate(r)
        allv = np.concatenate([g, pooled])
        floor = max(float(allv[allv > 0].min()) if (allv > 0).any() else 1e-3, 1e-4) * 0.9  # a deviation of 0 sits at the floor
        edges = np.geomspace(floor, max(float(allv.max()), floor * 10) * 1.1, 60)
        ax.hist(np.clip(pooled, edges[0], edges[-1]), bins=edges, color=RANDOM, alpha=0.35,
                weights=np.full(pooled.size, 1.0 / pooled.size), label=f"random batches ({len(r)} shuffles)")
        ax.hist(np.clip(g, edges[0], edges[-1]), bins=edges, color=GREEDY, alpha=0.5, weights=np.full(g.size, 1.0 / g.size),
                label="greedy batches")
        best = np.array([d.min() for d in r])
        ax.axvline(max(g.max(), floor), color=GREEDY, lw=2, label=f"greedy's worst {g.max():.3f}")
        for i, b in enumerate(best):
            ax.axvline(max(b, floor), color=RANDOM, lw=0.8, ls=":", label=f"each shuffle's best (median {np.median(best):.3f})" if i == 0
                       else None)
        _log_x(ax)
        ax.set_xlabel(f"max share deviation of a batch of {batch_size} sequences")
        ax.set_ylabel("share of batches")
        ax.set_title(kind.replace("_", " "), fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle("Don't Shuffle, Optimize: the worst greedy batch vs the best random batch (lower = more diverse)", fontsize=11)
    fig.tight_layout()
    return save_png(fig, path)


def plot_stable_rank_claim(mats: Mapping[tuple[str, str], tuple[list[int], np.ndarray]], path: str | os.PathLike) -> Path:
    """Paired log stable-rank ratio greedy/random per probe batch (points, one colour per seed) and
    their mean, per checkpoint and block; above 0 = greedy higher."""
    keys = list(mats)
    fig = new_figure(figsize=(3.2 * max(len(keys), 1) + 1, 4.2))
    axes = np.atleast_1d(fig.subplots(1, max(len(keys), 1), sharey=True))
    for ax, key in zip(axes, keys):
        seeds, d = mats[key]
        for s in range(d.shape[0]):
            ax.scatter(np.arange(d.shape[1]), d[s], s=12, alpha=0.8, label=f"seed {seeds[s]}" if len(seeds) == d.shape[0] else None)
        ax.axhline(0, color="black", lw=0.8)
        ax.axhline(d.mean(), color=GREEDY, lw=2, label=f"mean {d.mean():+.4f}")
        ax.set_title(f"{key[1]} @ {key[0]}", fontsize=10)
        ax.set_xlabel("probe batch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("mean log(srank greedy / srank random)")
    fig.suptitle("Don't Shuffle, Optimize: stable rank of batch gradients, greedy vs random (paired)", fontsize=11)
    fig.tight_layout()
    return save_png(fig, path)


def plot_diversity_claim(table: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Distinct clusters per sequence (mean, with min and std) per strategy, the paper's means as
    markers; beside it, the mean per-batch token-share deviation."""
    names = table["strategy"].to_list()
    x = np.arange(len(names))
    fig = new_figure(figsize=(12, 4.4))
    a, b = fig.subplots(1, 2)
    mean, std, mn = (table[c].to_numpy() for c in ("clusters_per_seq_mean", "clusters_per_seq_std", "clusters_per_seq_min"))
    a.bar(x, mean, yerr=std, color=[OTHER if n not in ("stratified", "greedy", "random") else GREEDY if n == "greedy" else RANDOM
                                    if n == "random" else "#2ca02c" for n in names], alpha=0.8, capsize=3, label="mean ± std")
    a.scatter(x + 0.25, mn, color="black", marker="v", s=30, zorder=5, label="min")
    a.set_xticks(x, names, rotation=20)
    a.set_ylabel(f"distinct clusters per sequence (k={int(table['k'][0])})")
    a.set_title("Diversity-ordered training's table on this corpus", fontsize=10)
    a.legend(fontsize=8)
    dev = table["batch_token_share_dev_mean"].to_numpy()
    b.bar(x, dev, color=OTHER, alpha=0.8)
    for i, v in enumerate(dev):
        b.text(i, v, f"{v:.3f}", ha="center", va="bottom", fontsize=8)
    b.set_xticks(x, names, rotation=20)
    b.set_ylabel("mean over batches of max_k |share − global share|")
    b.set_title("Token-share deviation per batch (lower = closer to the corpus mixture)", fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


def plot_stationarity_claim(names: list[str], per_char: np.ndarray, z_star: float, path: str | os.PathLike) -> Path:
    """Greedy's largest standardized deviation per characteristic (over every tenth and the prefix)
    against the random shuffles' envelope z*: a bar past the line is a part outside random's band."""
    fig = new_figure(figsize=(8, 3.8))
    ax = fig.subplots()
    y = np.arange(len(names))
    colors = [RANDOM if z > z_star else GREEDY for z in per_char]
    ax.barh(y, per_char, color=colors)
    ax.axvline(z_star, color=OTHER, ls="--", label=f"random's envelope z* = {z_star:.2f}")
    ax.axvline(0, color="black", lw=0.6)
    ax.set_yticks(y, names, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("greedy's largest (value − random mean) / random sd over the tenths and the prefix")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Don't Shuffle, Optimize: characteristics constant throughout training (share deviations: one-sided)", fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


def plot_fidelity_claim(greedy: np.ndarray, random: np.ndarray, path: str | os.PathLike) -> Path:
    """The two chunk-gradient cosine matrices on one colour scale, and the distributions of their
    off-diagonal cosines."""
    og, orr = offdiagonal(greedy), offdiagonal(random)
    lo, hi = min(og.min(), orr.min()), max(og.max(), orr.max())
    fig = new_figure(figsize=(13, 4.2))
    axes = fig.subplots(1, 3)
    for ax, name, m in ((axes[0], "greedy", greedy), (axes[1], "random", random)):
        im = ax.imshow(np.where(np.eye(m.shape[0], dtype=bool), np.nan, m), vmin=lo, vmax=hi, cmap="viridis")
        off = offdiagonal(m)
        ax.set_title(f"{name}: off-diagonal {off.min():.3f}–{off.max():.3f} (std {off.std():.4f})", fontsize=9)
        ax.set_xlabel("chunk")
        ax.set_ylabel("chunk")
        fig.colorbar(im, ax=ax, fraction=0.046)
    bins = np.linspace(lo, max(og.max(), orr.max()), 30)
    axes[2].hist(orr, bins=bins, color=RANDOM, alpha=0.5, label="random")
    axes[2].hist(og, bins=bins, color=GREEDY, alpha=0.5, label="greedy")
    axes[2].set_xlabel("cosine of two chunks' gradients")
    axes[2].set_ylabel("chunk pairs")
    axes[2].legend(fontsize=8)
    fig.suptitle("TerRIFIC curricula: mixture fidelity at a checkpoint trained on non-overlapping data (diagonal blank)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return save_png(fig, path)


def plot_epoch_claim(logs: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Loss and gradient norm per step for each order (mean over seeds, min-max band), epoch
    boundaries as vertical lines."""
    fig = new_figure(figsize=(12, 4.4))
    axes = fig.subplots(1, 2)
    colors = {"topical": RANDOM, "stratified": GREEDY}
    for ax, metric in zip(axes, ("loss", "grad_norm")):
        for arm, run in logs.group_by("arm", maintain_order=True):
            arm = arm[0]
            wide = run.pivot(on="seed", index="step", values=metric).sort("step")
            steps = wide["step"].to_numpy()
            y = wide.drop("step").to_numpy().astype(np.float64)
            c = colors.get(arm, OTHER)
            ax.plot(steps, np.nanmean(y, axis=1), color=c, lw=1.5, label=f"{arm} ({y.shape[1]} seeds)")
            ax.fill_between(steps, np.nanmin(y, axis=1), np.nanmax(y, axis=1), color=c, alpha=0.2, lw=0)
        first = logs.filter(pl.col("epoch") > 0).group_by("epoch").agg(pl.col("step").min())["step"].to_list()
        for i, s in enumerate(sorted(first)):
            ax.axvline(s - 0.5, color="black", ls="--", lw=0.8, label="epoch boundary" if i == 0 else None)
        ax.set_xlabel("step")
        ax.set_ylabel(metric.replace("_", " "))
        ax.set_yscale("log" if metric == "grad_norm" else "linear")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Diversity-ordered training: the epoch boundary, topical vs stratified (diversity) order", fontsize=11)
    fig.tight_layout()
    return save_png(fig, path)


def plot_packing_claim(units: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Held-out loss per packing arm: each seed's mean over the held-out documents and their mean."""
    arms = sorted(units["arm"].unique().to_list(), key=lambda a: (a.split("-x")[0], float(a.split("-x")[1]) if "-x" in a else 1.0))
    per_seed = units.group_by("arm", "seed").agg(pl.col("loss").mean())
    fig = new_figure(figsize=(8, 4.4))
    ax = fig.subplots()
    for i, arm in enumerate(arms):
        v = per_seed.filter(pl.col("arm") == arm)["loss"].to_numpy()
        ax.scatter(np.full(v.size, i), v, color=OTHER, s=20, zorder=3)
        ax.hlines(v.mean(), i - 0.3, i + 0.3, color=GREEDY if arm == "concat-x1" else RANDOM if arm.startswith("padding") else "black",
                  lw=2)
        ax.text(i, v.mean(), f" ppl {np.exp(v.mean()):.1f}", va="bottom", fontsize=8)
    ax.set_xticks(np.arange(len(arms)), arms)
    ax.set_ylabel("held-out loss (nats/token): seeds and their mean")
    ax.set_title("Packing & shuffling: padding vs concat, and the atom size (x seq_len)", fontsize=11)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return save_png(fig, path)


def plot_min_stable_rank_claim(cells: Mapping[tuple[str, str], tuple[np.ndarray, np.ndarray]], path: str | os.PathLike) -> Path:
    """Minimum stable rank over the probe batches, random's (x) against greedy's (y), one point per
    seed and layer matrix, per checkpoint and block; above the diagonal = greedy's worst batch higher."""
    keys = list(cells)
    fig = new_figure(figsize=(3.4 * max(len(keys), 1) + 1, 4.0))
    axes = np.atleast_1d(fig.subplots(1, max(len(keys), 1)))
    for ax, key in zip(axes, keys):
        g, r = (np.ravel(v) for v in cells[key])
        ax.scatter(r, g, s=14, alpha=0.8, color=GREEDY)
        lo, hi = float(min(g.min(), r.min())), float(max(g.max(), r.max()))
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
        ax.set_title(f"{key[1]} @ {key[0]}", fontsize=10)
        ax.set_xlabel("random: min srank over batches")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("greedy: min srank over batches")
    fig.suptitle("TerRIFIC curricula: worst-batch (minimum) stable rank, greedy vs random", fontsize=11)
    fig.tight_layout()
    return save_png(fig, path)


def plot_packing_protocol_claim(lp: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Packing & shuffling's protocol: training perplexity of each 1% slice of the last epoch per arm
    (geometric mean over seeds); the last slice is the final perplexity."""
    fig = new_figure(figsize=(8, 4.4))
    ax = fig.subplots()
    for arm in sorted(set(lp["arm"])):
        m = lp.filter(pl.col("arm") == arm).group_by("slice").agg(pl.col("log_ppl").mean()).sort("slice")
        ax.plot(m["slice"].to_numpy() + 1, np.exp(m["log_ppl"].to_numpy()), lw=1.4, label=arm)
    ax.set_xlabel("slice of the last epoch (%)")
    ax.set_ylabel("training perplexity")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle("Packing & shuffling: perplexity over the last epoch, 100 slices (Appendix A.6)", fontsize=11)
    fig.tight_layout()
    return save_png(fig, path)
