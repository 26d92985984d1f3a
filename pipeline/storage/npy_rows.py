"""Rows of a 2-D ``.npy`` file read with ``pread`` instead of through a memory map.

Copying rows out of a memory-mapped file takes one page fault per page, served by the kernel's
readahead on one thread, so a cold span arrives one page at a time and a scattered sample one
request at a time; one ``pread`` per block, and concurrent ``pread`` calls for a scattered
sample, let the disk serve many requests at once. Past a few requests in flight a sample reads no
faster (``benchmarks/bench_sample_read.py`` reads one with 1 to 64 in flight).
Reads release the GIL, so the threads here overlap their requests.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

EXTENT_GAP = 16  # selected rows at most this many rows apart are read as one request
EXTENT_BYTES = 8 << 20  # the most bytes of one request
READERS = 8  # concurrent requests of a scattered read (chosen with benchmarks/bench_sample_read.py)


class NpyRows:
    """A 2-D C-order ``.npy`` file's rows, read by position: ``rows(a, b)`` or ``take(sorted rows)``."""

    def __init__(self, path: str | os.PathLike):
        mm = np.load(path, mmap_mode="r")  # parses the header only
        if mm.ndim != 2 or not mm.flags.c_contiguous:
            raise ValueError(f"{path}: not a 2-D C-order array ({mm.shape})")
        self.path, self.shape, self.dtype, self.offset = Path(path), mm.shape, mm.dtype, int(mm.offset)
        self.row_bytes = int(mm.shape[1] * mm.dtype.itemsize)

    def _read(self, fd: int, a: int, out: np.ndarray) -> None:
        if not out.size:
            return
        view, at = memoryview(out.reshape(-1).view(np.uint8)), self.offset + a * self.row_bytes
        while view.nbytes:
            n = os.preadv(fd, [view], at)
            if n <= 0:
                raise OSError(f"{self.path}: file ends before row {a + out.shape[0]}")
            view, at = view[n:], at + n

    def rows(self, a: int, b: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``a .. b`` (``0 <= a <= b <= n``), into ``out`` when given (shape (b - a, d))."""
        if not 0 <= a <= b <= self.shape[0]:
            raise IndexError(f"rows {a}:{b} of {self.shape[0]}")
        out = np.empty((b - a, self.shape[1]), self.dtype) if out is None else out
        if out.shape != (b - a, self.shape[1]) or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous {self.dtype} array of shape {(b - a, self.shape[1])}")
        fd = os.open(self.path, os.O_RDONLY)
        try:
            self._read(fd, a, out)
        finally:
            os.close(fd)
        return out

    def take(self, local: np.ndarray) -> np.ndarray:
        """The rows at ``local`` (ascending, repeats allowed, in range), read as concurrent requests
        of nearby rows (:data:`EXTENT_GAP`, at most :data:`EXTENT_BYTES` each)."""
        local = np.asarray(local, dtype=np.int64)
        out = np.empty((local.size, self.shape[1]), self.dtype)
        if not local.size:
            return out
        if (np.diff(local) < 0).any() or local[0] < 0 or local[-1] >= self.shape[0]:
            raise IndexError("rows must be ascending and in range")
        most = max(1, EXTENT_BYTES // max(self.row_bytes, 1))
        # an extent: selected rows at most EXTENT_GAP apart, within one aligned span of `most` rows
        cuts = np.flatnonzero((np.diff(local) > EXTENT_GAP) | (np.diff(local // most) != 0)) + 1
        bounds = np.concatenate([[0], cuts, [local.size]])
        fd = os.open(self.path, os.O_RDONLY)

        def read(task: np.ndarray) -> None:
            for s, e in zip(bounds[task], bounds[task + 1]):
                lo = int(local[s])
                block = np.empty((int(local[e - 1]) - lo + 1, self.shape[1]), self.dtype)
                self._read(fd, lo, block)
                out[s:e] = block[local[s:e] - lo]

        tasks = np.array_split(np.arange(bounds.size - 1), min(bounds.size - 1, READERS * 8))
        try:
            if len(tasks) == 1:
                read(tasks[0])
            else:
                with ThreadPoolExecutor(READERS) as pool:
                    list(pool.map(read, tasks))
        finally:
            os.close(fd)
        return out
