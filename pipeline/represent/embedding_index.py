"""The embedding matrix as an index over the ``embedding_shards`` files: no gathered copy of the rows.

The matrix (every kept document's embedding, N x d, in ``corpus.parquet`` order) is described by
the runs of :mod:`pipeline.data.token_index`, counted in rows: spans of consecutive matrix rows
that lie consecutively in one shard's ``.npy``. A shard the corpus kept whole is one run; a shard
with dropped documents is one run per stretch of consecutive kept rows. :func:`write_embedding_runs`
writes them (``embeddings/runs.parquet``, with each shard file's SHA-256, so the index's data
version changes whenever its rows do) and :func:`open_embeddings` reads them as
:class:`ShardedRows`, which indexes like the memory-mapped (N, d) matrix and reads only the rows
asked for from the shards' files.

A data root written before the index (``embeddings/embeddings.npy``, no ``runs.parquet``) is
refused with the fix: rematerialize ``embeddings``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from pipeline.data.token_index import TokenRuns, grouped, locate, read_runs, shard_runs, write_runs
from pipeline.errors import StrataInputError
from pipeline.storage.npy_rows import NpyRows

if TYPE_CHECKING:
    from pipeline.storage.layout import Layout

FIX = "rematerialize the embeddings asset (strata run --select embeddings)"


def write_embedding_runs(parts: Sequence[tuple[Path, np.ndarray | None]], path: Path) -> int:
    """Index the chosen rows (None: all) of each shard ``.npy`` of ``parts``, in order, as the
    matrix's runs at ``path``; the row count. Reads only the files' headers."""
    paths, starts, files, locals_ = [], [], [], []
    at, width, dtype = 0, None, None
    for p, rows in parts:
        mm = np.load(p, mmap_mode="r")
        if mm.ndim != 2 or (width is not None and (mm.shape[1], mm.dtype) != (width, dtype)):
            raise StrataInputError(f"embedding shard of shape {mm.shape} {mm.dtype}, others ({width},) {dtype}", path=p,
                                   fix="delete the embeddings/shards folder and rematerialize embedding_shards")
        width, dtype = mm.shape[1], mm.dtype
        local, lengths = shard_runs(np.ones(mm.shape[0], np.int64), rows)
        starts.append(at + np.cumsum(lengths) - lengths)
        files.append(np.full(local.size, len(paths), np.int64))
        locals_.append(local)
        paths.append(Path(p))
        at += int(lengths.sum())
    if width is None:
        raise StrataInputError("no embedding rows to index", path=path, fix="materialize corpus with training documents")
    runs = TokenRuns(paths, np.append(np.concatenate(starts), at).astype(np.int64), np.concatenate(files), np.concatenate(locals_))
    write_runs(runs, path, dtype=np.dtype(dtype).str, dim=int(width))
    return at


def has_embeddings(where: "Layout | str | os.PathLike") -> bool:
    """Whether the data root (or the ``runs.parquet`` path) has the embedding matrix's index; an
    older root's gathered ``embeddings.npy`` alone is refused with the fix."""
    path = Path(getattr(where, "embeddings", where))
    old = path.parent / "embeddings.npy"
    if not path.is_file() and old.is_file():
        raise StrataInputError("embeddings.npy is a gathered matrix this version no longer reads (no runs.parquet)", path=old, fix=FIX)
    return path.is_file()


def open_embeddings(where: "Layout | str | os.PathLike") -> "ShardedRows":
    """The embedding matrix of a :class:`pipeline.storage.layout.Layout` (or of its ``runs.parquet``)."""
    path = Path(getattr(where, "embeddings", where))
    if not has_embeddings(path):
        raise StrataInputError("no embedding matrix", path=path, fix="materialize the embeddings asset")
    runs, frame = read_runs(path, "embedding matrix", "embedding shard", FIX)
    if not frame.height:
        raise StrataInputError("the embedding matrix has no rows", path=path, fix=FIX)
    return ShardedRows(runs, np.dtype(frame["dtype"][0]), int(frame["dim"][0]))


class ShardedRows:
    """Read-only (N, d) rows of the embedding matrix, read through :class:`TokenRuns` (counted in
    rows) from the shards' ``.npy`` files with ``pread`` (:mod:`pipeline.storage.npy_rows`).
    Every read returns a new array."""

    def __init__(self, runs: TokenRuns, dtype: np.dtype, dim: int):
        self.runs, self.dtype = runs, np.dtype(dtype)
        self._files: dict[int, NpyRows] = {}
        self.shape, self.ndim = (int(runs.start[-1]), int(dim)), 2
        self.size = self.shape[0] * self.shape[1]

    def __len__(self) -> int:
        return self.shape[0]

    def _file(self, f: int) -> NpyRows:
        if f not in self._files:
            rows = NpyRows(self.runs.paths[f])
            if rows.shape[1] != self.shape[1] or rows.dtype != self.dtype:
                raise StrataInputError(f"embedding shard of shape {rows.shape} {rows.dtype}, the index says (*, {self.shape[1]}) "
                                       f"{self.dtype}",
                                       path=self.runs.paths[f], fix=FIX)
            self._files[f] = rows
        return self._files[f]

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The rows at ``rows`` (integers of any shape, any order, repeats; negative from the end):
        shape ``rows.shape + (d,)``, one fancy read per shard file."""
        idx = np.asarray(rows)
        if idx.dtype == bool:
            if idx.shape != (self.shape[0],):
                raise IndexError(f"boolean index of shape {idx.shape} for {self.shape[0]} rows")
            idx = np.flatnonzero(idx)
        flat = idx.astype(np.int64, copy=False).ravel()
        n = self.shape[0]
        if flat.size and (flat.min() < -n or flat.max() >= n):
            raise IndexError(f"row index out of range for {n} rows")
        flat = np.where(flat < 0, flat + n, flat)
        f, local = locate(self.runs, flat)
        out = np.empty((flat.size, self.shape[1]), self.dtype)
        for u, sel in grouped(f):
            order = np.argsort(local[sel], kind="stable")  # one file's rows read in ascending order
            out[sel[order]] = self._file(u).take(local[sel][order])
        return out.reshape(idx.shape + (self.shape[1],))

    def span(self, a: int, b: int) -> np.ndarray:
        """Rows ``a .. b``, read as one slice of each run they cover."""
        a, b = max(0, a), min(self.shape[0], b)
        if b <= a:
            return np.empty((0, self.shape[1]), self.dtype)
        starts = self.runs.start
        first, last = np.searchsorted(starts, [a, b - 1], side="right") - 1
        out = np.empty((b - a, self.shape[1]), self.dtype)
        for r in range(int(first), int(last) + 1):
            lo, hi = max(a, int(starts[r])), min(b, int(starts[r + 1]))
            at = int(self.runs.local[r]) + lo - int(starts[r])
            self._file(int(self.runs.file[r])).rows(at, at + hi - lo, out=out[lo - a : hi - a])
        return out

    def __getitem__(self, index):
        if isinstance(index, tuple):
            head, rest = (index[0], index[1:]) if index else (slice(None), ())
            return self[head][(Ellipsis, *rest)] if rest else self[head]
        if isinstance(index, slice):
            a, b, step = index.indices(self.shape[0])
            return self.span(a, b) if step == 1 else self.take(np.arange(a, b, step))
        if index is Ellipsis:
            return self.span(0, self.shape[0])
        if np.ndim(index) == 0 and not isinstance(index, (bool, np.bool_)):
            return self.take(np.array([int(index)]))[0]
        return self.take(index)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self.span(0, self.shape[0])
        return out if dtype is None else out.astype(dtype, copy=False)
