"""Writing a report figure: PNG at one resolution, atomically."""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.figure import Figure

from pipeline.storage.atomic import atomic_path

DPI = 110


def save_png(fig: Figure, path: str | os.PathLike, tight: bool = True) -> Path:
    """Write ``fig`` to ``path`` as a PNG at :data:`DPI`, cropped to its drawn area when ``tight``."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI, **({"bbox_inches": "tight"} if tight else {}))
    return Path(path)
