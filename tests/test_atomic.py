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
    expected = {p.name: _read_sha(p) for p in tmp_path.iterdir() if not p.name.startswith(("ref", "."))}
    assert {p.name for p in tmp_path.iterdir() if p.name.startswith(".")} == {f".{name}.sha256" for name in expected}

    def no_reading(*args, **kwargs):
        raise AssertionError("file_sha256 read a file this process wrote")

    monkeypatch.setattr(atomic, "open", no_reading, raising=False)
    assert {name: file_sha256(tmp_path / name) for name in expected} == expected
    monkeypatch.setattr(atomic, "_DIGESTS", {})  # another process: the digest comes from the sidecar beside the file
    assert {name: file_sha256(tmp_path / name) for name in expected} == expected


def test_a_changed_file_is_refused_and_another_file_is_hashed_anew(tmp_path):
    """A file Strata wrote and recorded, then changed in place (another size, or the same size and
    another modification time), is refused, never hashed as the new truth; so is a different file
    moved into its place (the record lies beside the file, so that it survives a copy, which gives
    every file a new inode too). Without its record (the sidecar removed) a file is hashed anew."""
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
    atomic._DIGESTS.clear()
    with pytest.raises(StrataInputError, match="changed on disk since Strata wrote it"):
        file_sha256(path)
    atomic.sidecar(path).unlink()  # no record of Strata's
    assert file_sha256(path) == _read_sha(path) == hashlib.sha256(b"same length").hexdigest()


def test_write_rows_rejects_a_wrong_row_count(tmp_path):
    with pytest.raises(ValueError, match="got 3 rows for 4"):
        write_rows([np.zeros((3, 2), np.float32)], 4, tmp_path / "x.npy")
    assert not (tmp_path / "x.npy").exists()


def test_the_digest_record_travels_with_a_copy_that_drops_extended_attributes(tmp_path):
    """A copy that keeps no extended attributes (``cp -r``, ``rsync -a`` without ``-X``, tar, an object
    store; here ``shutil.copyfile``) keeps the record beside the file: a flipped byte in the copy is
    refused, never hashed as the new truth, and an intact copy is taken."""
    import shutil

    src, dst = tmp_path / "src", tmp_path / "dst"
    write_bin(np.arange(1000, dtype=np.int64), src / "a.bin")
    write_json({"a": 1}, src / "b.json")
    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    atomic._DIGESTS.clear()
    atomic._VERIFIED.clear()
    assert atomic.recorded_sha256(dst / "a.bin") == _read_sha(src / "a.bin")
    data = bytearray((dst / "a.bin").read_bytes())
    data[100] ^= 0x01
    with open(dst / "a.bin", "r+b") as fh:
        fh.write(data)
    with pytest.raises(StrataInputError, match="changed on disk since Strata wrote it"):
        file_sha256(dst / "a.bin")
    with pytest.raises(StrataInputError, match="a.bin"):
        atomic.verify_sha256(dst / "a.bin")
    assert atomic.recorded_sha256(dst / "a.bin") == _read_sha(src / "a.bin")  # the record is not replaced
    assert file_sha256(dst / "b.json") == _read_sha(src / "b.json")


def test_replacing_a_file_through_atomic_path_drops_its_record(tmp_path):
    """Bytes written otherwise than through atomic_writer get no record, and the record of the bytes
    they replace goes: the new file is hashed anew, not refused."""
    path = tmp_path / "a.bin"
    write_bin(np.arange(10, dtype=np.int64), path)
    assert atomic.sidecar(path).is_file()
    with atomic.atomic_path(path) as tmp:
        tmp.write_bytes(b"other bytes")
    assert not atomic.sidecar(path).exists()
    atomic._DIGESTS.clear()
    assert file_sha256(path) == hashlib.sha256(b"other bytes").hexdigest()
