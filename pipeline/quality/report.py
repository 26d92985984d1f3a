"""The quality scores for people: the distribution per source and per cluster as tables (DuckDB
``quality_by_source``, ``quality_by_cluster``) and a figure (``quality/quality.png``: one box per
source and per cluster, the filter's threshold drawn)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.quality.scorers import spec
from pipeline.render.figures import DPI, new_figure, save_png

MAX_CLUSTERS = 40  # boxes of the cluster panel: the clusters with the most tokens


def distribution(docs: pl.DataFrame, by: str) -> pl.DataFrame:
    """Per value of ``by``: documents, tokens, the mean (per document and per token), quartiles and
    the tokens the filter removed. ``docs``: ``by``, quality, n_tokens, removed (bool)."""
    q = pl.col("quality")
    return (docs.group_by(by).agg(documents=pl.len(), tokens=pl.col("n_tokens").sum(), mean=q.mean(),
                                  token_mean=(q * pl.col("n_tokens")).sum() / pl.col("n_tokens").sum(),
                                  p10=q.quantile(0.1, "nearest"), p50=q.quantile(0.5, "nearest"), p90=q.quantile(0.9, "nearest"),
                                  removed_tokens=pl.col("n_tokens").filter(pl.col("removed")).sum())
            .with_columns(pl.col("mean", "token_mean", "p10", "p50", "p90").round(6)).sort(by))


def plot_quality(docs: pl.DataFrame, threshold: float | None, path: str | os.PathLike) -> Path:
    """Box plots of the scores by source (left) and by cluster (right: the :data:`MAX_CLUSTERS`
    with the most tokens when there are more), whiskers at the 5th and 95th percentiles."""
    fig = new_figure(figsize=(12, 4.2), dpi=DPI)
    for ax, by in zip(fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2]}), ("source", "cluster")):
        sizes = docs.group_by(by).agg(t=pl.col("n_tokens").sum()).sort("t", descending=True)
        keys = sizes[by].to_list()[:MAX_CLUSTERS] if by == "cluster" else sorted(sizes[by].to_list())
        keys = sorted(keys) if by == "cluster" else keys
        values = [docs.filter(pl.col(by) == k)["quality"].to_numpy() for k in keys]
        if keys:
            ax.boxplot(values, whis=(5, 95), showfliers=False, medianprops={"color": "tab:red"})
            ax.set_xticks(np.arange(1, len(keys) + 1), [str(k) for k in keys], rotation=45 if by == "source" else 90,
                          ha="right" if by == "source" else "center", fontsize=8)
        if threshold is not None:
            ax.axhline(threshold, color="tab:gray", linestyle="--", linewidth=1, label=f"filter threshold {threshold}")
            ax.legend(fontsize=8)
        title = f"quality by {by}" + (f"\n(the {MAX_CLUSTERS} of {sizes.height} clusters with the most tokens)"
                                      if by == "cluster" and sizes.height > MAX_CLUSTERS else "")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(by)
        ax.set_ylabel("score")
        ax.ticklabel_format(axis="y", useOffset=False)  # scores as they are, not as offsets from one
    return save_png(fig, path)


def summary_line(layout, cfg) -> str | None:
    """``quality: <scorer>, held-out AUC ...; mean score by source ...; figures ...`` of a data root
    whose quality stage ran (``cfg``: its ``QualityConfig``), else None. A trained scorer's model is
    read from its cache (``quality/models/``), never trained here."""
    if not (cfg.enabled and layout.quality.is_file()):
        return None
    facts = spec(cfg.scorer).prepare(cfg, layout.inside("quality", "models")).facts
    scores = pl.read_parquet(layout.quality, columns=["doc_id", "quality"])
    by_source = (pl.read_parquet(layout.documents, columns=["doc_id", "source"]).join(scores, on="doc_id")
                 .group_by("source").agg(pl.col("quality").mean()).sort("source"))
    auc = f", held-out AUC {facts['heldout_auc']:.3f}" if facts.get("heldout_auc") is not None else ""
    figures = [p for p in (layout.inside("quality", "quality.png"), layout.inside("report", "quality_along_stream.png")) if p.is_file()]
    return (f"quality: {cfg.scorer}{auc}; mean score by source: "
            + ", ".join(f"{s} {q:.3f}" for s, q in by_source.iter_rows())
            + (f"; figures: {', '.join(str(p) for p in figures)}" if figures else ""))
