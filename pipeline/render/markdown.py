"""Markdown pipe tables (the one way every report, metadata block and CLI output writes them) and
images inlined for the Dagster UI."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Iterable, Sequence

import polars as pl


def cell(value: object) -> str:
    """A table cell: a float to 4 significant digits, anything else as ``str``."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def table_lines(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """The lines of a pipe table; ``align`` holds each column's alignment, ``l`` or ``r`` (left where absent)."""
    rule = "".join("---:|" if i < len(align) and align[i] == "r" else "---|" for i in range(len(header)))
    return ["| " + " | ".join(header) + " |", "|" + rule] + ["| " + " | ".join(map(cell, row)) + " |" for row in rows]


def frame_table(df: pl.DataFrame) -> str:
    """``df`` as a pipe table, one row per row."""
    return "\n".join(table_lines(df.columns, df.iter_rows()))


def image_markdown(path: Path, title: str) -> str:
    """Inline a PNG or GIF as a data URI (shown by the Dagster UI's markdown metadata)."""
    data = base64.b64encode(path.read_bytes()).decode()
    mime = "image/gif" if path.suffix == ".gif" else "image/png"
    return f"**{title}**\n\n![{title}](data:{mime};base64,{data})"
