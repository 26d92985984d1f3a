"""Kernels over segment rows grouped by sequence (a packing's order), shared by packing, the
sequence features and the diagnostics: one pass, no per-row temporaries."""

from __future__ import annotations

import numba
import numpy as np
from numba import njit

CHUNKS_PER_THREAD = 4  # chunks of sequences differ in rows: a few a thread balance the load
MIN_CHUNK_ROWS = 1 << 16  # a chunk smaller than this costs more in scheduling than it saves


def n_chunks(rows: int) -> int:
    """Chunks of a parallel pass over ``rows`` rows: a few a thread, one for a small input."""
    return max(1, min(CHUNKS_PER_THREAD * numba.get_num_threads(), rows // MIN_CHUNK_ROWS))


def even_cuts(n: int, chunks: int) -> np.ndarray:
    """``cuts[c]:cuts[c+1]`` (c < ``chunks``): ``range(n)`` in about equal parts."""
    return n * np.arange(chunks + 1, dtype=np.int64) // chunks


@njit(cache=True)
def grouped(seq: np.ndarray) -> bool:
    """Rows grouped by ascending sequence id (a packing's order, a composition's order)."""
    for i in range(1, seq.size):
        if seq[i] < seq[i - 1]:
            return False
    return True


@njit(cache=True)
def docs_per_sequence(seq: np.ndarray, doc: np.ndarray, n_sequences: int) -> np.ndarray:
    """Distinct documents of each sequence id, for rows :func:`grouped` by sequence."""
    out = np.zeros(n_sequences, np.int64)
    lo = 0
    while lo < seq.size:
        hi = lo + 1
        while hi < seq.size and seq[hi] == seq[lo]:
            hi += 1
        for i in range(lo, hi):
            new = True
            for j in range(lo, i):
                if doc[j] == doc[i]:
                    new = False
                    break
            if new:
                out[seq[lo]] += 1
        lo = hi
    return out


@njit(cache=True)
def insert_sorted(values: np.ndarray, lo: int, hi: int, v) -> None:
    """Insert ``v`` into the ascending ``values[lo:hi]`` (``values[hi]`` is free), shifting the
    larger ones right: a sequence's few distinct groups, kept sorted as they come."""
    j = hi
    while j > lo and values[j - 1] > v:
        values[j] = values[j - 1]
        j -= 1
    values[j] = v
