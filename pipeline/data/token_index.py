"""The token store as an index over the ``token_shards`` files: no gathered copy of the ids.

The store (every kept document's ids and EOS, in ``corpus.parquet`` order) is described by
*runs*: spans of consecutive store positions that lie consecutively in one shard's ``.bin`` file.
A shard the corpus kept whole is one run; a shard with dropped documents is one run per stretch
of consecutive kept rows. :func:`pipeline.data.token_shards.gather_tokens` writes them
(:func:`write_token_runs`, ``tokens/runs.parquet``) and :func:`open_token_runs` reads them.
:class:`ShardedTokens` reads the store through the runs from the shards' memory-mapped files
and indexes like a memory-mapped flat array of the ids (an int, a slice, an integer array), so a reader of the store (packed sequences,
training batches, exports) gets the values a gathered copy would hold. The embedding matrix is indexed by the same runs, counted
in rows (:mod:`pipeline.represent.embedding_index`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.storage.atomic import file_sha256, write_bin, write_parquet


@dataclass(frozen=True)
class TokenRuns:
    """``paths[file[r]]`` holds store positions ``start[r] .. start[r + 1]`` from its position ``local[r]``."""

    paths: list[Path]
    start: np.ndarray  # (R + 1,) int64: run starts in the store, then its size
    file: np.ndarray  # (R,) int64
    local: np.ndarray  # (R,) int64


def shard_runs(lengths: np.ndarray, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``(local start, length)`` of the runs of one shard's documents ``rows`` (None: all), given
    every document's ``lengths`` (ids and EOS) in its ``.bin``."""
    first = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    if rows is None:
        return first[:1], first[-1:]
    if not rows.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    heads = rows[np.concatenate([[0], breaks])]
    tails = rows[np.concatenate([breaks - 1, [rows.size - 1]])]
    return first[heads], first[tails + 1] - first[heads]


def write_runs(runs: TokenRuns, path: Path, **constants: str | int) -> Path:
    """Write ``runs`` as Parquet (``start, end, path, local, sha256``, then ``constants`` as columns;
    paths relative to ``path``'s folder). ``sha256`` is the shard file's content hash, so the index
    (and the data version recorded for it) changes whenever the values it points at do."""
    rel = [os.path.relpath(p, Path(path).parent) for p in runs.paths]
    digests = [file_sha256(p) for p in runs.paths]  # taken while the shard was written, when this process wrote it
    frame = pl.DataFrame({"start": runs.start[:-1], "end": runs.start[1:], "path": [rel[f] for f in runs.file], "local": runs.local,
                          "sha256": [digests[f] for f in runs.file]},
                         schema={"start": pl.Int64, "end": pl.Int64, "path": pl.String, "local": pl.Int64, "sha256": pl.String})
    return write_parquet(frame.with_columns(**{k: pl.lit(v, pl.Int64 if isinstance(v, int) else pl.String) for k, v in constants.items()}),
                         path)


def write_token_runs(runs: TokenRuns, dtype: np.dtype, path: Path) -> Path:
    """Write the token store's ``runs`` (:func:`write_runs`, with the ids' ``dtype``)."""
    return write_runs(runs, path, dtype=np.dtype(dtype).str)


def write_single_run(tokens: np.ndarray, path: Path) -> Path:
    """A token store of one file: ``tokens`` (ids and EOS of every document, in order) written
    beside ``path`` as ``store.bin`` and indexed by ``path`` as one run (for stores built outside
    ``token_shards``, e.g. an already tokenized corpus or a test's data root)."""
    tokens = np.ascontiguousarray(tokens)
    bin_path = write_bin(tokens, Path(path).parent / "store.bin")
    runs = TokenRuns([bin_path], np.array([0, tokens.size], np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64))
    return write_token_runs(runs, tokens.dtype, path)


def read_runs(path: Path, store: str, shard: str, fix: str) -> tuple[TokenRuns, pl.DataFrame]:
    """The runs an index written by :func:`write_runs` holds, and the index itself; ``store`` and
    ``shard`` name what it indexes and its files, ``fix`` how to rebuild it, in the errors."""
    path = Path(path)
    frame = pl.read_parquet(path)
    if not frame.height:
        return TokenRuns([], np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)), frame
    start, end = frame["start"].to_numpy(), frame["end"].to_numpy()
    if start[0] != 0 or (start[1:] != end[:-1]).any() or (end <= start).any():
        raise StrataInputError(f"the runs do not tile the {store}", path=path, fix=fix)
    names = frame["path"].unique().sort()
    missing = [n for n in names.to_list() if not (path.parent / n).is_file()]
    if missing:
        raise StrataInputError(f"{shard} file {missing[0]} is missing", path=path, fix=fix)
    return TokenRuns([path.parent / n for n in names.to_list()], np.append(start, end[-1]).astype(np.int64),
                     names.search_sorted(frame["path"]).to_numpy().astype(np.int64), frame["local"].to_numpy().astype(np.int64)), frame


def locate(runs: TokenRuns, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(file, position in that file)`` of each of ``positions`` (flat, in range)."""
    run = np.searchsorted(runs.start, positions, side="right") - 1
    return runs.file[run], runs.local[run] + positions - runs.start[run]


def grouped(files: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """``(file, indices into files that name it)`` for each file named, in one stable sort."""
    if not files.size:
        return []
    order = np.argsort(files, kind="stable")
    cuts = np.flatnonzero(np.diff(files[order])) + 1
    return [(int(files[g[0]]), g) for g in np.split(order, cuts)]


def open_token_runs(path: Path) -> "ShardedTokens":
    """The token store an index written by :func:`write_token_runs` describes."""
    runs, frame = read_runs(path, "token store", "token shard", "rematerialize token_shards and tokens")
    return ShardedTokens(runs, np.dtype(frame["dtype"][0] if frame.height else np.uint16))


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

    def file_ids(self, f: int) -> np.ndarray:
        """The memory-mapped ids of the file ``runs.paths[f]``."""
        return self._map(f)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(run, file, position in the file)`` of each store position (flat int64 arrays)."""
        flat = np.asarray(positions, dtype=np.int64).ravel()
        if flat.size and (flat.min() < 0 or flat.max() >= self.size):
            raise IndexError(f"token position out of range for a store of {self.size}")
        run = np.searchsorted(self.runs.start, flat, side="right") - 1
        return run, self.runs.file[run], self.runs.local[run] + flat - self.runs.start[run]

    def take(self, positions: np.ndarray) -> np.ndarray:
        """The ids at ``positions`` (any shape of non-negative int positions below the size)."""
        pos = np.asarray(positions, dtype=np.int64)
        _, f, local = self.locate(pos)
        out = np.empty(f.size, self.dtype)
        for u, sel in grouped(f):
            out[sel] = self._map(u)[local[sel]]
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
