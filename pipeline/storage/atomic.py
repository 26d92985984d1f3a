"""Atomic, deterministic artifact writes (temp file + fsync + rename) and content hashes.

Every artifact under the data root is written through these helpers, so a reader never sees a
partial file: either the previous complete version or the new complete version exists.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np

if TYPE_CHECKING:  # polars is only needed by callers that hand in a frame
    import polars as pl


_UMASK = os.umask(0o022)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; artifacts are ordinary files
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary directory; swap it into ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        old = path.with_name(f".{path.name}.old")
        if old.exists():
            shutil.rmtree(old)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        if old.exists():
            shutil.rmtree(old)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def write_parquet(df: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Write ``df`` atomically; no statistics timestamps, so equal frames give equal bytes."""
    with atomic_path(path) as tmp:
        df.write_parquet(tmp, compression="zstd", statistics=False)
    return Path(path)


def write_npy(arr: np.ndarray, path: str | os.PathLike) -> Path:
    """Write a plain (non-object) array atomically as .npy."""
    if arr.dtype == object:
        raise TypeError("object arrays are not written (they would need pickle)")
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, arr, allow_pickle=False)
    return Path(path)


def write_rows(blocks: Iterable[np.ndarray], n_rows: int, path: str | os.PathLike, dtype: np.dtype = np.dtype(np.float32)) -> Path:
    """Write ``n_rows`` rows, given as consecutive 2-D blocks, atomically as one ``.npy`` through a
    memory map (memory: one block)."""
    from numpy.lib.format import open_memmap

    with atomic_path(path) as tmp:
        mm, at = None, 0
        for block in blocks:
            if mm is None:
                mm = open_memmap(tmp, mode="w+", dtype=dtype, shape=(n_rows, block.shape[1]))
            mm[at : at + block.shape[0]] = block
            at += block.shape[0]
        if mm is None or at != n_rows:
            raise ValueError(f"{path}: got {at} rows for {n_rows}")
        mm.flush()
        del mm
    return Path(path)


def write_bin(arr: np.ndarray, path: str | os.PathLike) -> Path:
    """Write the raw bytes of a contiguous array atomically (read back with ``np.memmap``)."""
    with atomic_path(path) as tmp:
        np.ascontiguousarray(arr).tofile(tmp)
    return Path(path)


def write_text(text: str, path: str | os.PathLike) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(obj: object, path: str | os.PathLike) -> Path:
    return write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", path)


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes (streams; any size)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()
