"""Figures of the TerRIFIC mixture stage (PNG): learned weights per iteration, the learned curriculum."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.ordering.curriculum import Curriculum
from pipeline.render.figures import cluster_colors, need_columns, new_figure, save_png


def plot_weights(weights: pl.DataFrame, scores: pl.DataFrame, path: str | os.PathLike, corpus_share: np.ndarray | None = None) -> Path:
    """Left: cluster weights per iteration (stacked bars; ``iteration, cluster, weight``), corpus
    shares as the first bar. Right: target / held-out loss of each iteration's model
    (``iteration, metric, value``)."""
    need_columns(weights, ("iteration", "cluster", "weight"), "mixture weights")
    wide = weights.pivot(on="cluster", index="iteration", values="weight", sort_columns=True).sort("iteration").fill_null(0.0)
    clusters = sorted((c for c in wide.columns if c != "iteration"), key=int)
    its = wide["iteration"].to_numpy()
    w = np.stack([wide[c].to_numpy() for c in clusters])
    fig = new_figure(figsize=(11, 4.2))
    ax, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    labels = [str(int(i)) for i in its]
    if corpus_share is not None:
        w = np.hstack([np.asarray(corpus_share, dtype=np.float64)[:, None], w])
        labels = ["corpus"] + labels
    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for c, color, row in zip(clusters, cluster_colors(len(clusters)), w):
        ax.bar(x, row, bottom=bottom, color=color, width=0.8, label=f"cluster {c}")
        bottom += row
    ax.set_xticks(x, labels)
    ax.set_xlabel("iteration (weights trained on; last = after the final update)")
    ax.set_ylabel("cluster weight softmax(l)")
    ax.set_ylim(0, 1)
    ax.set_title("Learned static mixture (TerRIFIC)")
    if len(clusters) <= 16:
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if scores.height:
        for metric, marker in (("target_loss", "o"), ("heldout_loss", "s")):
            s = scores.filter(pl.col("metric") == metric).sort("iteration")
            if s.height:
                ax2.plot(s["iteration"].to_numpy(), s["value"].to_numpy(), marker=marker, label=metric.replace("_", " "))
        ax2.set_xlabel("iteration")
        ax2.set_ylabel("mean token loss (nats)")
        ax2.set_title("Model trained on each iteration's mixture")
        ax2.legend(fontsize=8)
        ax2.xaxis.get_major_locator().set_params(integer=True)
    fig.subplots_adjust(wspace=0.45)
    return save_png(fig, path)


def plot_curriculum(cur: Curriculum, n_min: float, n_max: float, path: str | os.PathLike, initial: Curriculum | None = None) -> Path:
    """Stacked p(N) = softmax(f(N)) over log-spaced N of the learned curriculum (knots marked);
    the initial mixture as a dashed line of the top cluster's share when given."""
    n = np.geomspace(n_min, n_max, 200)
    p = cur.probabilities(np.log(n))
    k = p.shape[1]
    fig = new_figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    ax.stackplot(n, p.T, colors=cluster_colors(k), labels=[f"cluster {c}" for c in range(k)], lw=0)
    for s in cur.log_tokens:
        if n_min <= np.exp(s) <= n_max:
            ax.axvline(np.exp(s), color="k", lw=0.5, alpha=0.4)
    ax.set_xscale("log")
    ax.set_xlim(n_min, n_max)
    ax.set_ylim(0, 1)
    ax.set_xlabel("training tokens N (log); vertical lines: knots")
    ax.set_ylabel("p(N) = softmax(f(N))")
    ax.set_title("Learned curriculum (TerRIFIC curricula, Algorithm 1)")
    if k <= 16:
        ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save_png(fig, path)
