"""Document pieces of packed sequences: where every document span and run of padding lies.

Strata's trainer, the exporters and ``torch_dataset`` (the reader of a ``numpy`` export) cut
sequences into the same pieces, so a document boundary means the same thing everywhere. Only numpy
here: a ``numpy`` export is read with pyarrow and numpy alone (``benchmarks/gpu_check.py`` runs on
machines without polars).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Pieces:
    """Document pieces of every sequence: sequence s spans ``length[ptr[s]:ptr[s+1]]`` (summing to
    L), each piece one document span (with its inserted EOS) or a run of padding (``is_doc`` false)."""

    ptr: np.ndarray  # (n_sequences + 1,) int64, by sequence id
    length: np.ndarray  # int32
    is_doc: np.ndarray  # bool

    def of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(counts per sequence, lengths, is_doc)`` of the pieces of ``ids``, concatenated in order."""
        ids = np.asarray(ids, np.int64)
        lo, hi = self.ptr[ids], self.ptr[ids + 1]
        counts = hi - lo
        sel = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        return counts, self.length[sel], self.is_doc[sel]


def sequence_pieces(segments: Any, seq_len: int, n_sequences: int | None = None) -> Pieces:
    """Cut every sequence at its document boundaries (segment starts and ends) and at padding.

    ``segments``: the segments table as a polars frame or a mapping of column name to array
    (``sequence_id``, ``seq_token_start``, ``n_tokens``, optional ``eos_added``); ``n_sequences``:
    the ids' range (default the largest id + 1).
    """
    sid = np.asarray(segments["sequence_id"]).astype(np.int64)
    start = np.asarray(segments["seq_token_start"]).astype(np.int64)
    ext = np.asarray(segments["n_tokens"]).astype(np.int64)
    if "eos_added" in segments:
        ext = ext + np.asarray(segments["eos_added"]).astype(np.int64)
    m = n_sequences if n_sequences is not None else int(sid.max()) + 1 if sid.size else 0
    width = seq_len + 1
    every = np.arange(m, dtype=np.int64) * width
    keys = np.unique(np.concatenate([every, every + seq_len, sid * width + start, sid * width + start + ext]))
    s, b = keys // width, keys % width
    same = s[1:] == s[:-1]
    owner, begin = s[:-1][same], b[:-1][same]
    length = (b[1:] - b[:-1])[same]
    doc_starts = np.unique(sid * width + start)
    is_doc = np.isin(owner * width + begin, doc_starts)
    ptr = np.searchsorted(owner, np.arange(m + 1))
    return Pieces(ptr.astype(np.int64), length.astype(np.int32), is_doc)


def positions_in_pieces(lengths: np.ndarray) -> np.ndarray:
    """Position ids restarting at 0 at the start of every piece (flat, ``lengths.sum()`` long)."""
    total = int(lengths.sum())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return (np.arange(total, dtype=np.int64) - starts).astype(np.int32)
