"""Writing a report figure: PNG at one resolution, at most :data:`MAX_WIDTH_PX` wide, atomically; the
cluster colours every figure shares; the check that a plotted frame has its rows and columns."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.heavy import lazy
from pipeline.storage.atomic import atomic_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# matplotlib is imported when the first figure is drawn (pipeline/heavy.py), never by importing a stage
matplotlib = lazy("matplotlib")
backend_agg = lazy("matplotlib.backends.backend_agg")
mpl_colors = lazy("matplotlib.colors")
mpl_figure = lazy("matplotlib.figure")

DPI = 110
# The widest figure the Dagster UI's metadata pop-up shows uncut: the dialog is at most 1,280 px
# wide with 20 px of padding each side, less its vertical scrollbar when the report is long, and a
# markdown report's images are drawn at their pixel width. A wider figure is saved at a lower dpi,
# not cropped.
MAX_WIDTH_PX = 1200
PAD_INCHES = 0.1  # matplotlib's default pad around a tight bounding box


def new_figure(**kwargs: Any) -> Figure:
    """A ``matplotlib.figure.Figure(**kwargs)`` (the Agg canvas, no pyplot state): every figure of the
    library starts here, so that importing a stage imports no matplotlib."""
    return mpl_figure.Figure(**kwargs)


def figure_dpi(fig: Figure, tight: bool = True) -> float:
    """The dpi ``fig`` is saved at: :data:`DPI`, or less so that its saved width (the drawn area
    plus the pad when ``tight``) is at most :data:`MAX_WIDTH_PX` pixels."""
    if tight:
        canvas = fig.canvas if isinstance(fig.canvas, backend_agg.FigureCanvasAgg) else backend_agg.FigureCanvasAgg(fig)
        width_in = fig.get_tightbbox(canvas.get_renderer()).width + 2 * PAD_INCHES
    else:
        width_in = fig.get_figwidth()
    # one pixel of slack: the saved size is the width in inches times the dpi, rounded
    return min(float(DPI), (MAX_WIDTH_PX - 1) / width_in)


def save_png(fig: Figure, path: str | os.PathLike, tight: bool = True) -> Path:
    """Write ``fig`` to ``path`` as a PNG at :func:`figure_dpi` (:data:`DPI` unless that would
    make it wider than :data:`MAX_WIDTH_PX`), cropped to its drawn area when ``tight``."""
    dpi = figure_dpi(fig, tight)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, **({"bbox_inches": "tight", "pad_inches": PAD_INCHES} if tight else {}))
    return Path(path)


def cluster_colors(n_clusters: int) -> np.ndarray:
    """(K, 3) RGB colours: tab10/tab20 for small K, else golden-ratio hues with varied
    saturation and value, so neighbouring cluster ids get clearly different colours."""
    if n_clusters <= 10:
        return np.asarray(matplotlib.colormaps["tab10"].colors)[:n_clusters, :3]
    if n_clusters <= 20:
        return np.asarray(matplotlib.colormaps["tab20"].colors)[:n_clusters, :3]
    j = np.arange(n_clusters)
    hsv = np.stack([(j * 0.6180339887) % 1.0, 0.55 + 0.45 * ((j * 7) % 3) / 2, 0.95 - 0.3 * ((j * 5) % 4) / 3], axis=1)
    return mpl_colors.hsv_to_rgb(hsv)


def need_columns(df: pl.DataFrame, cols: tuple[str, ...], what: str) -> None:
    """Refuse an empty frame, or one without the columns ``cols`` a figure of ``what`` plots."""
    if df.height == 0:
        raise StrataInputError(f"no rows to plot for {what}", fix="run the training/analysis first")
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise StrataInputError(f"{what} frame lacks columns {missing}", fix=f"pass a frame with columns {list(cols)}")
