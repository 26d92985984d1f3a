"""Atomic writers hash the bytes as they write them, and file_sha256 serves that digest."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from pipeline.errors import StrataInputError
from pipeline.storage import atomic
from pipeline.storage.atomic import (
    atomic_writer,
    file_sha256,
    write_bin,
    write_json,
    write_npy,
    write_parquet,
    write_rows,
)


def _read_sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_writers_give_the_bytes_of_the_library_writers_and_their_digest_without_reading(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.random((1000, 7)).astype(np.float32)
    frame = pl.DataFrame({"a": np.arange(5000), "b": [str(i) for i in range(5000)]})
    table = frame.to_arrow()
    np.save(tmp_path / "ref.npy", x)
    np.save(tmp_path / "ref_f.npy", np.asfortranarray(x))
    frame.write_parquet(tmp_path / "ref.parquet", compression="zstd", statistics=False)
    with pq.ParquetWriter(tmp_path / "ref_pa.parquet", table.schema, compression="zstd", write_statistics=False) as w:
        w.write_table(table, row_group_size=1500)

    write_npy(x, tmp_path / "a.npy")
    write_npy(np.asfortranarray(x), tmp_path / "a_f.npy")
    write_rows([x[:300], x[300:301], x[301:]], 1000, tmp_path / "rows.npy")
    write_parquet(frame, tmp_path / "a.parquet")
    with (atomic_writer(tmp_path / "pa.parquet") as sink,
          pq.ParquetWriter(sink, table.schema, compression="zstd", write_statistics=False) as w):
        w.write_table(table, row_group_size=1500)
    write_bin(x[:, 2], tmp_path / "col.bin")
    write_json({"b": 1, "a": [1, 2]}, tmp_path / "a.json")

    for ours, ref in [("a.npy", "ref.npy"), ("a_f.npy", "ref_f.npy"), ("rows.npy", "ref.npy"), ("a.parquet", "ref.parquet"),
                      ("pa.parquet", "ref_pa.parquet")]:
        assert (tmp_path / ours).read_bytes() == (tmp_path / ref).read_bytes(), ours
    assert (tmp_path / "col.bin").read_bytes() == np.ascontiguousarray(x[:, 2]).tobytes()
    expected = {p.name: _read_sha(p) for p in tmp_path.iterdir() if not p.name.startswith("ref")}

    def no_reading(*args, **kwargs):
        raise AssertionError("file_sha256 read a file this process wrote")

    monkeypatch.setattr(atomic, "open", no_reading, raising=False)
    assert {name: file_sha256(tmp_path / name) for name in expected} == expected
    if atomic._attribute_sha256(tmp_path / "a.npy") is not None:  # the file system keeps user attributes
        monkeypatch.setattr(atomic, "_DIGESTS", {})  # another process: the digest comes from the file's attribute
        assert {name: file_sha256(tmp_path / name) for name in expected} == expected


def test_a_changed_file_is_refused_and_another_file_is_hashed_anew(tmp_path):
    """A file Strata wrote and recorded, then changed in place (another size, or the same size and
    another modification time), is refused, never hashed as the new truth; a different file moved
    into its place (no record of Strata's) is hashed anew."""
    path = tmp_path / "a.bin"
    write_bin(np.arange(10, dtype=np.int64), path)
    first = file_sha256(path)
    path.write_bytes(b"other bytes")  # in place, another size
    with pytest.raises(StrataInputError, match="changed on disk since Strata wrote it"):
        file_sha256(path)
    write_bin(np.arange(10, dtype=np.int64), path)
    assert file_sha256(path) == first
    atomic._DIGESTS.clear()
    with open(path, "r+b") as fh:  # in place, the same size, another modification time
        fh.write(b"\xff")
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 1))
    with pytest.raises(StrataInputError, match="changed on disk since Strata wrote it"):
        file_sha256(path)
    other = tmp_path / "b.bin"
    other.write_bytes(b"same length")
    os.replace(other, path)  # another file, the same size
    assert file_sha256(path) == _read_sha(path) == hashlib.sha256(b"same length").hexdigest()


def test_write_rows_rejects_a_wrong_row_count(tmp_path):
    with pytest.raises(ValueError, match="got 3 rows for 4"):
        write_rows([np.zeros((3, 2), np.float32)], 4, tmp_path / "x.npy")
    assert not (tmp_path / "x.npy").exists()
