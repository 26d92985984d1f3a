"""Rows read from a .npy file with pread equal the rows numpy loads, for spans and scattered sorted
selections (extents split by gap and by size, read concurrently)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.storage import npy_rows
from pipeline.storage.npy_rows import NpyRows


@pytest.fixture
def matrix(tmp_path):
    x = np.random.default_rng(0).standard_normal((5000, 24)).astype(np.float32)
    np.save(tmp_path / "m.npy", x)
    return x, NpyRows(tmp_path / "m.npy")


def test_spans(matrix):
    x, rows = matrix
    assert rows.shape == x.shape and rows.dtype == x.dtype
    for a, b in [(0, 5000), (17, 18), (4999, 5000), (123, 4001), (7, 7)]:
        np.testing.assert_array_equal(rows.rows(a, b), x[a:b])
    out = np.zeros((10, 24), np.float32)
    assert rows.rows(40, 50, out=out) is out and np.array_equal(out, x[40:50])
    with pytest.raises(IndexError):
        rows.rows(10, 5001)


@pytest.mark.parametrize("gap,extent_bytes", [(16, 8 << 20), (0, 1 << 12), (3, 24 * 4 * 5)])
def test_scattered_rows(matrix, monkeypatch, gap, extent_bytes):
    x, rows = matrix
    monkeypatch.setattr(npy_rows, "EXTENT_GAP", gap)
    monkeypatch.setattr(npy_rows, "EXTENT_BYTES", extent_bytes)
    rng = np.random.default_rng(gap)
    for sel in (np.sort(rng.choice(5000, 700, replace=False)), np.sort(rng.integers(0, 5000, 3000)),  # sparse; dense with repeats
                np.array([0, 4999]), np.array([42]), np.arange(5000), np.array([], np.int64)):
        np.testing.assert_array_equal(rows.take(sel), x[sel])
    with pytest.raises(IndexError):
        rows.take(np.array([5, 3]))
    with pytest.raises(IndexError):
        rows.take(np.array([4, 5000]))


def test_truncated_file_is_an_error(tmp_path):
    np.save(tmp_path / "m.npy", np.ones((100, 8), np.float32))
    rows = NpyRows(tmp_path / "m.npy")
    with open(tmp_path / "m.npy", "r+b") as fh:
        fh.truncate(rows.offset + 50 * 32)
    with pytest.raises(OSError, match="file ends"):
        rows.rows(40, 60)
