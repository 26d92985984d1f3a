"""Reading a ``numpy`` export: numpy and JSON alone, so a trainer's process (the GPU image has no
polars) memory-maps it without the rest of the export code."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def open_numpy(export_dir: str | Path) -> tuple[np.memmap, dict]:
    """Memory-map a ``numpy`` export: ``(tokens (n_sequences, seq_len), meta)``."""
    d = Path(export_dir)
    meta = json.loads((d / "meta.json").read_text(encoding="utf-8"))
    tokens = np.memmap(d / "tokens.bin", dtype=meta["dtype"], mode="r", shape=(meta["n_sequences"], meta["seq_len"]))
    return tokens, meta
