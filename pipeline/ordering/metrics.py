"""How well an order keeps the global mixture (seed 000, "Adherence To Our Uniform Distribution Objective")."""

from __future__ import annotations

import numpy as np

from pipeline.ordering.features import Csr


def _batch_of_entries(x: Csr, rows: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(batch index, column, value) of every nonzero of the rows, taken in ``rows`` order."""
    sub = x.take_rows(rows)
    pos = np.repeat(np.arange(rows.size, dtype=np.int64), np.diff(sub.indptr))
    return pos // batch, sub.indices, sub.data


def batch_max_deviation(x: Csr, lengths: np.ndarray, rows: np.ndarray, batch: int = 32, chunk: int = 2048) -> np.ndarray:
    """Per batch of ``batch`` consecutive sequences: max_j |share_j(batch) - share_j(all)|."""
    rows = np.asarray(rows, dtype=np.int64)
    target = x.column_totals() / float(lengths.sum())
    n_batches = -(-rows.size // batch)
    out = np.empty(n_batches)
    for lo in range(0, n_batches, chunk):
        hi = min(n_batches, lo + chunk)
        sel = rows[lo * batch : hi * batch]
        b, col, val = _batch_of_entries(x, sel, batch)
        dense = np.bincount(b * x.n_cols + col, weights=val, minlength=(hi - lo) * x.n_cols).reshape(hi - lo, x.n_cols)
        tok = np.bincount(np.arange(sel.size) // batch, weights=lengths[sel], minlength=hi - lo)
        out[lo:hi] = np.abs(dense / tok[:, None] - target).max(axis=1)
    return out


def distinct_per_batch(x: Csr, rows: np.ndarray, batch: int = 32) -> np.ndarray:
    """Number of distinct columns (clusters or length bins) present in each batch."""
    b, col, _ = _batch_of_entries(x, np.asarray(rows, dtype=np.int64), batch)
    pairs = np.unique(b * x.n_cols + col)
    return np.bincount(pairs // x.n_cols, minlength=-(-len(rows) // batch))


def prefix_error(x: Csr, lengths: np.ndarray, rows: np.ndarray, points: np.ndarray) -> np.ndarray:
    """||T(t) - tau S(t)||_2 / S(t) after the first t sequences, for each t in ``points``."""
    rows = np.asarray(rows, dtype=np.int64)
    tau = x.column_totals() / float(lengths.sum())
    b, col, val = _batch_of_entries(x, rows, 1)
    out = np.empty(len(points))
    for i, t in enumerate(points):
        keep = b < t
        T = np.bincount(col[keep], weights=val[keep], minlength=x.n_cols)
        S = lengths[rows[:t]].sum()
        out[i] = np.linalg.norm(T - tau * S) / S
    return out


def distinct_per_sequence(x: Csr) -> np.ndarray:
    """Distinct clusters (columns) in each sequence (seed 001's diversity measure)."""
    return np.diff(x.indptr)
