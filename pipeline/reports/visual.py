"""The ordering comparison report: every strategy's diagnostics side by side, as figures + markdown.

Used by the ``ordering_diagnostics`` / ``diagnostics_report`` assets and by ``strata report``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from pipeline.render.markdown import frame_table
from pipeline.reports import diagnostics as D
from pipeline.reports import plots
from pipeline.reports import stationarity as S
from pipeline.reports import windows as W
from pipeline.storage.documents import document_features
from pipeline.storage.layout import Layout, Store
from pipeline.threads import concurrently

SUMMARY_METRICS = [
    ("unique_clusters_per_seq_mean", "", "unique clusters / seq (mean)"),
    ("unique_clusters_per_seq_min", "", "unique clusters / seq (min)"),
    ("batch_dev_clusters_max", "batch=32", "cluster dev, batch 32 (max)"),
    ("batch_dev_clusters_mean", "batch=32", "cluster dev, batch 32 (mean)"),
    ("batch_dev_length_bins_max", "batch=32", "length-bin dev, batch 32 (max)"),
    ("batch_dev_length_bins_mean", "batch=32", "length-bin dev, batch 32 (mean)"),
]


def load_schedule(layout: Layout, strategy: str, docs: pl.DataFrame, length_bins: int) -> D.Schedule:
    """Join a strategy's ordering with its segments; length-bin edges shared by all strategies;
    the documents' ``source`` label when ``docs`` has one; a schedule realizing a mixture unrolled,
    its cluster deviations against the mixture's target shares."""
    return _schedule(docs, *_ordering_segments(layout, strategy), length_bins)


def strategy_schedule(layout: Layout, strategy: str, length_bins: int) -> D.Schedule:
    """:func:`load_schedule` of one strategy over :func:`document_features` with source codes, the
    documents read while its ordering and segments are."""
    # contiguous columns (NumPy views, not copies beside the frame's chunks); doc_id is the row index
    docs, (ordering, segments) = concurrently(lambda: document_features(layout, source_codes=True).drop("doc_id").rechunk(),
                                              lambda: _ordering_segments(layout, strategy, rechunk=True))
    return _schedule(docs, ordering, segments, length_bins)


def _ordering_segments(layout: Layout, strategy: str, rechunk: bool = False) -> tuple:
    """``Store.ordering`` of ``strategy`` and the columns of its segments a schedule reads."""
    ordering = Store(layout).ordering(strategy)
    columns = ["sequence_id", "doc_id", "n_tokens"] + (["seq_token_start"] if ordering.target_share is not None else [])
    segments = pl.read_parquet(ordering.segments_path, columns=columns)
    return ordering, segments.rechunk() if rechunk else segments


def _schedule(docs: pl.DataFrame, ordering, segments: pl.DataFrame, length_bins: int) -> D.Schedule:
    # the length bins' edges are the quantiles of every document's length (D.prepare's default), for any strategy
    return D.prepare(segments, ordering.order, docs["cluster"].to_numpy(), docs["stream_length"].to_numpy(), length_bins=length_bins,
                     doc_source=docs["source"] if "source" in docs.columns else None, target_share=ordering.target_share)


def write_figures(schedules: dict[str, D.Schedule], embeddings: np.ndarray | None, doc_cluster: np.ndarray, out_dir: Path,
                  batch_size: int = 32, stationarity: pl.DataFrame | None = None, prefix_sequences: int | None = None,
                  metrics: pl.DataFrame | None = None) -> dict[str, Path]:
    """Render every comparison figure into ``out_dir``; return {name: path}. With ``stationarity``
    (rows of ``pipeline.reports.stationarity.stationarity_table``), one figure per characteristic;
    with ``metrics`` (``ordering_metrics`` rows), one worst-window figure per strategy that has
    window rows (``window_deviation_<strategy>``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = {
        "ordering_bars": plots.plot_ordering_bars(schedules, out_dir / "ordering_bars.png"),
        "window_diversity": plots.plot_window_diversity(schedules, out_dir / "window_diversity.png"),
        "prefix_errors": plots.plot_prefix_errors(schedules, out_dir / "prefix_errors.png"),
        "batch_deviation": plots.plot_batch_histograms(schedules, out_dir / "batch_deviation.png", batch_size=batch_size),
    }
    if embeddings is not None:
        figs["cluster_cloud"] = plots.plot_cluster_cloud(embeddings, doc_cluster, out_dir / "cluster_cloud.png")
    animated = "greedy" if "greedy" in schedules else next(iter(schedules))
    figs["ordering_animation"] = plots.animate_ordering(schedules[animated], out_dir / f"ordering_animation_{animated}.gif")
    if stationarity is not None and not stationarity.is_empty():
        for name in S.characteristics(stationarity):
            figs[f"stationarity_{name}"] = plots.plot_stationarity(stationarity, name, out_dir / f"stationarity_{name}.png",
                                                                   prefix_sequences=prefix_sequences)
    if metrics is not None:
        for name in schedules:
            frame = W.window_frame(metrics, name)
            if not frame.is_empty():
                figs[f"window_deviation_{name}"] = plots.plot_window_deviation(frame, name, out_dir / f"window_deviation_{name}.png")
    return figs


def stationarity_summary(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per strategy: the characteristics (and parts) outside random's band, or "none"."""
    return pl.DataFrame(
        [{"strategy": s, "outside random's band": S.out_of_band_summary(rows) or "none"}
         for (s,), rows in frame.group_by("strategy", maintain_order=True)],
        schema={"strategy": pl.Utf8, "outside random's band": pl.Utf8},
    )


def window_summary(metrics: pl.DataFrame) -> pl.DataFrame:
    """One row per strategy with window rows: the window lengths (sequences) whose worst window is
    above every random shuffle's, for clusters and for length bins ("none" when inside)."""
    rows = []
    for strategy in metrics["strategy"].unique(maintain_order=True):
        frame = W.window_frame(metrics, strategy)
        if frame.is_empty():
            continue
        above = W.above_random(frame)
        rows.append({"strategy": strategy, **{f"{kind.replace('_', ' ')}: worst window above random's max at w =":
                                              ", ".join(map(str, ws)) or "none" for kind, ws in above.items()}})
    return pl.DataFrame(rows)


def summary_table(metrics: pl.DataFrame) -> pl.DataFrame:
    """One row per strategy with the headline metrics of ``SUMMARY_METRICS``."""
    rows = []
    for strategy in metrics["strategy"].unique(maintain_order=True):
        m = metrics.filter(pl.col("strategy") == strategy)
        row: dict[str, object] = {"strategy": strategy}
        for metric, setting, label in SUMMARY_METRICS:
            v = m.filter((pl.col("metric") == metric) & (pl.col("setting") == setting))["value"]
            row[label] = float(v[0]) if v.len() else None
        rows.append(row)
    return pl.DataFrame(rows)


def render_markdown(summary: pl.DataFrame, figures: dict[str, Path], base: Path, stationarity: pl.DataFrame | None = None,
                    windows: pl.DataFrame | None = None) -> str:
    """``report/diagnostics.md``: the summary table, each strategy's characteristics outside
    random's band (with ``stationarity``), the window lengths whose worst window is above random's
    (with ``windows``, a :func:`window_summary`), and relative links to the figures."""
    parts = ["# Ordering diagnostics", "", frame_table(summary), ""]
    if stationarity is not None and not stationarity.is_empty():
        parts += ["## Stationarity (by tenth of the stream and over the consumed prefix)", "",
                  frame_table(stationarity_summary(stationarity)), ""]
    if windows is not None and not windows.is_empty():
        parts += ["## Worst window (Don't Shuffle, Optimize's max over windows [a:b])", "", frame_table(windows), ""]
    parts += [f"## {name.replace('_', ' ')}\n\n![{name}]({p.relative_to(base)})\n" for name, p in figures.items()]
    return "\n".join(parts)
