"""The norm range of an embedding shard's rows, taken while the rows are written.

The ``embeddings_normalized`` check asks that every embedding is finite and unit-norm. Reading the
matrix back for it streams every byte of the embeddings (14 GB at 10M documents, half a minute
of disk reads). Instead ``embed_shards`` measures each row's norm as its block passes on the way
to the shard's ``.npy`` and writes the range beside the file (``<shard>.norms.json``), with the
file's SHA-256 (itself taken while writing, :mod:`pipeline.storage.atomic`). A record whose
digest still matches its file stands for the rows; a missing or stale one (a shard written
before this record existed, or a file changed since) is measured from the file, as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.storage.atomic import file_sha256, write_json

BLOCK_ROWS = 1 << 16  # rows a read of the file when there is no record


@dataclass
class NormRange:
    """Finite-ness and the least and greatest L2 norm of the rows seen (``np.linalg.norm`` per row)."""

    rows: int = 0
    finite: bool = True
    min_norm: float = np.inf
    max_norm: float = -np.inf

    def add(self, block: np.ndarray) -> np.ndarray:
        """Take ``block``'s rows into the range; returns ``block`` (to measure a stream as it passes)."""
        if block.shape[0]:
            self.finite &= bool(np.isfinite(block).all())
            norms = np.linalg.norm(block, axis=1)
            self.min_norm = min(self.min_norm, float(norms.min()))
            self.max_norm = max(self.max_norm, float(norms.max()))
            self.rows += int(block.shape[0])
        return block

    def merge(self, other: "NormRange") -> "NormRange":
        return NormRange(self.rows + other.rows, self.finite and other.finite,
                         min(self.min_norm, other.min_norm), max(self.max_norm, other.max_norm))


def norms_file(npy: Path) -> Path:
    """Where a shard file's :class:`NormRange` is recorded."""
    return Path(npy).with_suffix(".norms.json")


def record_norms(npy: Path, norms: NormRange) -> Path:
    """Record ``norms`` (measured from the rows just written to ``npy``) for the file as it is now."""
    return write_json({"sha256": file_sha256(npy), "rows": norms.rows, "finite": norms.finite,
                       "min_norm": norms.min_norm, "max_norm": norms.max_norm}, norms_file(npy))


def shard_norms(npy: Path) -> tuple[NormRange, bool]:
    """The norm range of every row of ``npy`` and whether it came from the record (else the file
    was read: no record, or one taken for other bytes)."""
    try:
        saved = json.loads(norms_file(npy).read_text())
    except (OSError, ValueError):
        saved = None
    if isinstance(saved, dict) and saved.get("sha256") == file_sha256(npy):
        return NormRange(int(saved["rows"]), bool(saved["finite"]), float(saved["min_norm"]), float(saved["max_norm"])), True
    rows, out = np.load(npy, mmap_mode="r"), NormRange()
    for a in range(0, rows.shape[0], BLOCK_ROWS):
        out.add(np.asarray(rows[a : a + BLOCK_ROWS]))
    return out, False
