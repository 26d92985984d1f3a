"""The ordering diagnostics report: every strategy's figures and ``report/diagnostics.md``.

What the ``diagnostics_report`` asset writes and ``strata report`` re-renders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from pipeline.reports import diagnostics as D
from pipeline.reports import visual as V
from pipeline.storage.atomic import write_text
from pipeline.storage.documents import document_features
from pipeline.storage.layout import Layout


def ordering_schedules(layout: Layout, strategies: Sequence[str], length_bins: int) -> tuple[pl.DataFrame, dict[str, D.Schedule]]:
    """The documents' features and each strategy's schedule, read from the data root."""
    docs = document_features(layout)
    return docs, {s: V.load_schedule(layout, s, docs, length_bins) for s in strategies}


def write_diagnostics_report(layout: Layout, docs: pl.DataFrame, schedules: dict[str, D.Schedule], embeddings: np.ndarray | None,
                             metrics: pl.DataFrame, stationarity: pl.DataFrame, prefix_sequences: int,
                             extra_figures: dict[str, Path] | None = None) -> tuple[pl.DataFrame, dict[str, Path], Path]:
    """Render the comparison figures into ``report/`` (with each strategy's worst-window figure
    from the window rows of ``metrics``) and write ``report/diagnostics.md`` (the summary of
    ``metrics``, what lies outside random's band in ``stationarity``, links to the figures and to
    ``extra_figures``). Returns (summary table, figures, the markdown's path)."""
    report_dir = layout.inside("report")
    figures = V.write_figures(schedules, embeddings, docs["cluster"].to_numpy(), report_dir, stationarity=stationarity,
                              prefix_sequences=prefix_sequences, metrics=metrics)
    figures.update(extra_figures or {})
    summary = V.summary_table(metrics)
    md = write_text(V.render_markdown(summary, figures, report_dir, stationarity, V.window_summary(metrics)), report_dir / "diagnostics.md")
    return summary, figures, md
