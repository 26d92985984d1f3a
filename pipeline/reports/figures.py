"""Writing a report figure: PNG at one resolution, at most :data:`MAX_WIDTH_PX` wide, atomically."""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.figure import Figure

from pipeline.storage.atomic import atomic_path

DPI = 110
# The widest figure the Dagster UI's metadata pop-up shows uncut: the dialog is at most 1,280 px
# wide with 20 px of padding each side, less its vertical scrollbar when the report is long, and a
# markdown report's images are drawn at their pixel width. A wider figure is saved at a lower dpi,
# not cropped.
MAX_WIDTH_PX = 1200
PAD_INCHES = 0.1  # matplotlib's default pad around a tight bounding box


def figure_dpi(fig: Figure, tight: bool = True) -> float:
    """The dpi ``fig`` is saved at: :data:`DPI`, or less so that its saved width (the drawn area
    plus the pad when ``tight``) is at most :data:`MAX_WIDTH_PX` pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if tight:
        canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
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
