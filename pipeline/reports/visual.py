"""The ordering comparison report: every strategy's diagnostics side by side, as figures + markdown.

Used by the ``ordering_diagnostics`` / ``diagnostics_report`` assets and by ``strata report``.
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.reports import diagnostics as D
from pipeline.reports import plots
from pipeline.reports import stationarity as S
from pipeline.reports import windows as W
from pipeline.reports.markdown import frame_table
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


def document_features(layout: Layout, source_codes: bool = False) -> pl.DataFrame:
    """doc_id-indexed ``cluster`` and ``stream_length`` (n_tokens + 1), plus ``source``: the labels,
    or with ``source_codes`` their dense integer codes in sorted label order (missing = ""), read
    through the column's dictionary without a string per document (what the diagnostics keep)."""
    if source_codes:  # only what the schedule reads, lengths in 32 bits; the codes decoded while the columns are read
        docs, codes = concurrently(lambda: Store(layout).document_clusters(["n_tokens"]), lambda: label_codes(layout.documents, "source"))
        return docs.select("doc_id", "cluster", source=pl.Series(codes), stream_length=(pl.col("n_tokens") + 1).cast(pl.Int32))
    docs = Store(layout).document_clusters(["n_tokens", "source"])
    return docs.with_columns(stream_length=pl.col("n_tokens") + 1)


def label_codes(path: Path, column: str, batch_rows: int = 1 << 20) -> np.ndarray:
    """Dense codes 0..S-1 (int32; sorted label text, a missing label is "") of a string column of
    a Parquet file, decoded batch by batch as a dictionary: one small int a row, no strings."""
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path, read_dictionary=[column])
    out = np.empty(f.metadata.num_rows, np.int32)
    spans, at = [], 0
    for batch in f.iter_batches(batch_size=batch_rows, columns=[column]):
        arr = batch.column(0)
        names = [("" if v is None else v) for v in arr.dictionary.to_pylist()]
        codes = arr.indices.fill_null(len(names)) if arr.null_count else arr.indices  # len(names): a missing label
        out[at : at + len(arr)] = int_values(codes)
        spans.append((at, at + len(arr), names + [""]))
        at += len(arr)
    present = sorted({n for _, _, names in spans for n in names})
    code = {n: i for i, n in enumerate(present)}
    for lo, hi, names in spans:
        out[lo:hi] = np.array([code[n] for n in names], np.int32)[out[lo:hi]]
    used = np.zeros(len(present), bool)  # labels of no row (and "" when no label is missing) leave no gap
    used[out] = True
    return out if used.all() else (np.cumsum(used) - 1).astype(np.int32)[out]


def int_values(array) -> np.ndarray:
    """An Arrow integer array without nulls as NumPy, read from its values buffer without a copy
    (pyarrow's own ``to_numpy`` imports pandas on its first use in a process)."""
    width = array.type.bit_width // 8
    return np.frombuffer(array.buffers()[1], f"<i{width}", len(array), array.offset * width)


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


def image_markdown(path: Path, title: str) -> str:
    """Inline a PNG or GIF as a data URI (shown by the Dagster UI's markdown metadata)."""
    data = base64.b64encode(path.read_bytes()).decode()
    mime = "image/gif" if path.suffix == ".gif" else "image/png"
    return f"**{title}**\n\n![{title}](data:{mime};base64,{data})"


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
