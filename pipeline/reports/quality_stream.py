"""Quality along the stream: each ordering's mean document quality score per stretch of its token
stream (docs/quality.md, "Seen").

The stream of a strategy is its ordering's sequences in position order (a schedule's repeats
included), each sequence's segments in their order. It is cut into ``windows`` stretches of equal
tokens; a segment falls in the window holding its first token. A window's score is the mean of its
segments' document scores weighted by the segment's tokens (the score of the tokens trained on).
DuckDB ``quality_along_stream`` (strategy, window, token_start, token_end, tokens, mean_quality) and
the figure ``report/quality_along_stream.png`` (one line per strategy, the training prefix marked).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.render.figures import DPI, new_figure, save_png
from pipeline.storage.layout import Layout, Store

WINDOWS = 50
SCHEMA = {"strategy": pl.String, "window_index": pl.Int64, "token_start": pl.Int64, "token_end": pl.Int64, "tokens": pl.Int64,
          "mean_quality": pl.Float64}


def stream_segments(layout: Layout, strategy: str, max_sequences: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(doc_id, n_tokens) of every segment of ``strategy``'s stream (its first ``max_sequences``
    positions when > 0), in stream order, and each position's segment count."""
    ordering = Store(layout).ordering(strategy)
    order = ordering.order[:max_sequences] if max_sequences > 0 else ordering.order
    seg = pl.read_parquet(ordering.segments_path, columns=["sequence_id", "doc_id", "n_tokens"])
    seg = seg.with_row_index("row").sort("sequence_id", "row", maintain_order=True)
    sid = seg["sequence_id"].to_numpy().astype(np.int64)
    n_seq = int(max(sid.max(initial=-1), order.max(initial=-1))) + 1
    start = np.searchsorted(sid, np.arange(n_seq + 1))  # sequence s's segments: rows [start[s], start[s+1])
    counts = start[order + 1] - start[order]
    rows = np.repeat(start[order] - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
    return seg["doc_id"].to_numpy().astype(np.int64)[rows], seg["n_tokens"].to_numpy().astype(np.int64)[rows], counts


def along_stream(doc_id: np.ndarray, n_tokens: np.ndarray, quality: np.ndarray, windows: int = WINDOWS) -> pl.DataFrame:
    """One row per window: token_start, token_end, tokens, mean_quality (token-weighted; NaN for an empty window)."""
    total = int(n_tokens.sum())
    edges = -(-np.arange(windows + 1, dtype=np.int64) * total // windows)  # ceil(i * total / windows)
    first = np.cumsum(n_tokens) - n_tokens
    w = np.clip(np.searchsorted(edges, first, side="right") - 1, 0, windows - 1)
    tokens = np.bincount(w, weights=n_tokens, minlength=windows)
    weighted = np.bincount(w, weights=n_tokens * quality[doc_id], minlength=windows)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = weighted / tokens
    return pl.DataFrame({"window_index": np.arange(windows), "token_start": edges[:-1], "token_end": edges[1:],
                         "tokens": tokens.astype(np.int64), "mean_quality": mean})


def quality_along_stream(layout: Layout, strategies: list[str], windows: int = WINDOWS, prefix_sequences: int = 0,
                         max_sequences: int = 0) -> tuple[pl.DataFrame, dict[str, int]]:
    """``SCHEMA`` rows of every strategy with an ordering (over its first ``max_sequences`` sequences
    when > 0), from ``quality/documents.parquet``, and per strategy the tokens of its first
    ``prefix_sequences`` sequences (the training prefix)."""
    q = pl.read_parquet(layout.quality, columns=["doc_id", "quality"]).sort("doc_id")
    quality = np.full(int(q["doc_id"].max()) + 1 if q.height else 0, np.nan)
    quality[q["doc_id"].to_numpy()] = q["quality"].to_numpy()
    parts, prefix = [], {}
    for s in strategies:
        doc_id, n_tokens, counts = stream_segments(layout, s, max_sequences)
        parts.append(along_stream(doc_id, n_tokens, quality, windows).with_columns(strategy=pl.lit(s)))
        prefix[s] = int(n_tokens[: int(counts[:prefix_sequences].sum())].sum())
    table = pl.concat(parts).select(pl.col(c).cast(t) for c, t in SCHEMA.items()) if parts else pl.DataFrame(schema=SCHEMA)
    return table, prefix


def plot_quality_stream(table: pl.DataFrame, prefix: dict[str, int], path: str | os.PathLike) -> Path:
    """Mean quality per window vs the window's middle token, one line per strategy; the end of the
    training prefix (the median over the strategies) as a dashed line where it ends before the stream."""
    fig = new_figure(figsize=(9, 4.2), dpi=DPI)
    ax = fig.subplots()
    for s in table["strategy"].unique(maintain_order=True).to_list():
        t = table.filter(pl.col("strategy") == s)
        mid = (t["token_start"].to_numpy() + t["token_end"].to_numpy()) / 2
        ax.plot(mid, t["mean_quality"].to_numpy(), marker=".", linewidth=1.2, label=s)
    trained = int(np.median(list(prefix.values()))) if prefix else 0
    if 0 < trained < int(table["token_end"].max()):
        ax.axvline(trained, color="tab:gray", linestyle="--", linewidth=1, label="end of training (max_steps)")
    n = int(table["window_index"].max()) + 1 if table.height else 0
    ax.set_title(f"quality along the stream: token-weighted mean score in {n} windows of equal tokens", fontsize=10)
    ax.set_xlabel("tokens into the stream")
    ax.set_ylabel("mean quality score")
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.legend(fontsize=8)
    return save_png(fig, path)
