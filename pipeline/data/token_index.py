"""The token store as an index over the ``token_shards`` files: no gathered copy of the ids.

:func:`shard_token_runs` describes the store :func:`pipeline.data.token_shards.gather_tokens`
writes (every kept document's ids and EOS, in ``corpus.parquet`` order) as *runs*: maximal spans
of consecutive store positions that lie consecutively in one shard's ``.bin`` file. A shard the
corpus kept whole is one run; a shard with dropped documents is one run per stretch of
consecutive kept rows. :class:`ShardedTokens` reads the store through the runs from the shards'
memory-mapped files, and indexes like the memory-mapped ``tokens.bin`` (an int, a slice, an
integer array), so a reader of the store (the sequence matrix, training batches) gives the same
values from either. The index costs 24 bytes a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.data.shard_docs import ShardDocs, kept_rows


@dataclass(frozen=True)
class TokenRuns:
    """``paths[file[r]]`` holds store positions ``start[r] .. start[r + 1]`` from its position ``local[r]``."""

    paths: list[Path]
    start: np.ndarray  # (R + 1,) int64: run starts in the store, then its size
    file: np.ndarray  # (R,) int64
    local: np.ndarray  # (R,) int64


def shard_token_runs(shards: list[tuple[dict, ShardDocs]], key: str, shard_dir: Path, corpus_path: Path) -> TokenRuns:
    """The runs of the store gathered from ``shards`` (manifest row, shard) in order."""
    from pipeline.data.token_shards import token_files

    paths: list[Path] = []
    starts, files, locals_ = [], [], []
    at = 0
    for row, shard in shards:
        if not int(row["n_docs"]):
            continue
        bin_path, stats_path = token_files(shard_dir, shard, key)
        n_all = pl.read_parquet(stats_path, columns=["n_tokens"])["n_tokens"].to_numpy() + 1
        first = np.concatenate([[0], np.cumsum(n_all)])
        rows = kept_rows(corpus_path, row, shard)
        if rows is None:
            rows = np.arange(n_all.size)
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        heads = rows[np.concatenate([[0], breaks])]
        tails = rows[np.concatenate([breaks - 1, [rows.size - 1]])]
        lengths = first[tails + 1] - first[heads]
        starts.append(at + np.concatenate([[0], np.cumsum(lengths)[:-1]]))
        files.append(np.full(heads.size, len(paths), np.int64))
        locals_.append(first[heads])
        paths.append(bin_path)
        at += int(lengths.sum())
    cat = (lambda parts: np.concatenate(parts).astype(np.int64)) if paths else (lambda parts: np.zeros(0, np.int64))
    return TokenRuns(paths, np.append(cat(starts), at), cat(files), cat(locals_))


class ShardedTokens:
    """Read-only ids of the token store, read through :class:`TokenRuns` from the shards' files."""

    def __init__(self, runs: TokenRuns, dtype: np.dtype):
        self.runs, self.dtype = runs, np.dtype(dtype)
        self._maps: dict[int, np.ndarray] = {}
        size = int(runs.start[-1])
        self.shape, self.size, self.ndim = (size,), size, 1

    def __len__(self) -> int:
        return self.size

    def _map(self, f: int) -> np.ndarray:
        if f not in self._maps:
            self._maps[f] = np.memmap(self.runs.paths[f], dtype=self.dtype, mode="r")
        return self._maps[f]

    def take(self, positions: np.ndarray) -> np.ndarray:
        """The ids at ``positions`` (any shape of non-negative int positions below the size)."""
        pos = np.asarray(positions, dtype=np.int64)
        flat = pos.ravel()
        if flat.size and (flat.min() < 0 or flat.max() >= self.size):
            raise IndexError(f"token position out of range for a store of {self.size}")
        run = np.searchsorted(self.runs.start, flat, side="right") - 1
        local = self.runs.local[run] + flat - self.runs.start[run]
        f = self.runs.file[run]
        out = np.empty(flat.size, self.dtype)
        for u in np.unique(f):
            sel = f == u
            out[sel] = self._map(int(u))[local[sel]]
        return out.reshape(pos.shape)

    def span(self, a: int, b: int) -> np.ndarray:
        """The ids at positions ``a .. b`` (a document: ``offsets[d] .. offsets[d + 1]``), read as one
        slice of each run it covers."""
        a, b = max(0, a), min(self.size, b)
        if b <= a:
            return np.empty(0, self.dtype)
        starts = self.runs.start
        first, last = np.searchsorted(starts, [a, b - 1], side="right") - 1
        parts = []
        for r in range(int(first), int(last) + 1):
            lo, hi = max(a, int(starts[r])), min(b, int(starts[r + 1]))
            at = int(self.runs.local[r]) + lo - int(starts[r])
            parts.append(self._map(int(self.runs.file[r]))[at : at + hi - lo])
        return np.concatenate(parts) if len(parts) > 1 else np.array(parts[0])

    def __getitem__(self, index):
        if isinstance(index, slice):
            a, b, step = index.indices(self.size)
            return self.span(a, b) if step == 1 else self.take(np.arange(a, b, step))
        if np.ndim(index) == 0:
            i = int(index)
            return self.take(np.array([i + self.size if i < 0 else i]))[0]
        return self.take(index)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)
