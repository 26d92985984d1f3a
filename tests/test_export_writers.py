"""``export.writers`` (issue 55): the flat formats written by several workers, each its stretch of
positions straight into its byte range of the one output, are the single writer's bytes — for
``numpy`` and ``megatron``, from a data root and from arrays, extending a frozen prefix, and when a
worker is killed mid-stretch (its stretch is written again); on a local Ray cluster too."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline.export import export_stream, open_stream, stream_from_arrays
from pipeline.export.extend import Previous
from pipeline.export.numpy_tokens import DocumentCheck, write_tokens
from pipeline.export.stretches import Writers, stretch_bounds
from pipeline.packing.pack import pack

L, G, EOS, PAD = 32, 8, 1, 0


def _arrays(variant: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 90, size=160)
    tokens = rng.integers(2, 5000, size=int(lengths.sum())).astype(np.uint16)
    offsets = np.r_[0, np.cumsum(lengths)]
    tokens[offsets[1::2] - 1] = EOS  # every other document ends with EOS: the others join their successor for EOS-based trainers
    packing = pack(variant, rng.permutation(lengths.size), lengths, L, seed=seed)
    return tokens, offsets, packing.segments, rng.permutation(packing.n_sequences)


def _stream(variant: str = "concat"):
    tokens, offsets, segments, order = _arrays(variant)
    return stream_from_arrays(tokens, offsets, segments, order, L, eos_id=EOS, pad_id=PAD)


def _root_stream(root: Path, variant: str):
    """The same stream opened from a data root (the way ``strata export`` opens it)."""
    from export_root import write_packing

    tokens, offsets, segments, order = _arrays(variant)
    layout = write_packing(root, tokens, offsets, segments, L, variant)
    pl.DataFrame({"position": np.arange(order.size), "sequence_id": order}).write_parquet(layout.ordering("greedy"))
    return open_stream(layout, "greedy", eos_id=EOS, pad_id=PAD)


def _same_files(a: Path, b: Path) -> None:
    names = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file() and not p.name.startswith("."))
    assert names == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file() and not p.name.startswith("."))
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_stretches_cover_the_positions_contiguously():
    assert stretch_bounds(0, 10, 3) == [(0, 3), (3, 7), (7, 10)]
    assert stretch_bounds(4, 6, 5) == [(4, 5), (5, 6)]
    assert stretch_bounds(6, 6, 2) == []


@pytest.mark.parametrize("fmt, variant, source, n", [("numpy", "concat", "root", 3), ("numpy", "padding", "arrays", 2),
                                                   ("megatron", "concat", "arrays", 2)])
def test_several_writers_give_the_single_writers_bytes(tmp_path, fmt, variant, source, n):
    """Every file, ``meta.json`` included: the concat packing has sequences that are not
    EOS-delimited (a document without EOS followed by another), so its count is the workers' merged. A data root's stream is opened again by
    each worker from the root; an in-memory one is carried to it."""
    stream = _root_stream(tmp_path / "root", variant) if source == "root" else _stream(variant)
    one = export_stream(stream, fmt, tmp_path / "one", global_batch=G)
    several = export_stream(stream, fmt, tmp_path / "several", global_batch=G, writers=Writers(n))
    _same_files(one["dir"], several["dir"])
    assert not list(several["dir"].glob(".*stretches"))
    if variant == "concat":
        assert json.loads((several["dir"] / "meta.json").read_text())["document_masking"]["not_eos_delimited_sequences"] > 0


def test_several_writers_extend_a_kept_prefix_to_the_same_bytes(tmp_path):
    """A frozen prefix's rows taken over from the previous export by the driver, the rest written by the workers."""
    stream = _stream("padding")
    (tmp_path / "prev").mkdir()
    prev = tmp_path / "prev"
    write_tokens(stream, prev / "tokens.bin", check=DocumentCheck(stream), label_mask_path=prev / "label_mask.bin")
    previous = Previous(tmp_path / "prev", 50, L, np.dtype(np.uint16))
    for name, writers in (("one", None), ("two", Writers(2))):
        (tmp_path / name).mkdir()
        check = DocumentCheck(stream)
        write_tokens(stream, tmp_path / name / "tokens.bin", check=check, label_mask_path=tmp_path / name / "label_mask.bin",
                     previous=previous, writers=writers, extra_tokens=np.array([EOS]))
        (tmp_path / name / "bad").write_text(str(check.bad))
    _same_files(tmp_path / "one", tmp_path / "two")


def stall_once(opener, claim: str, target: str):
    """``opener()``'s stream, except in the first worker to claim ``claim``: its read scribbles over
    its own stretch of ``target``, records its pid in ``claim`` and hangs (until killed)."""
    stream = opener()
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return stream
    where = np.argsort(stream.order)

    def read(ids: np.ndarray) -> np.ndarray:
        lo, hi = int(where[ids].min()), int(where[ids].max()) + 1
        with open(target, "r+b") as fh:
            fh.seek(lo * L * 2)
            fh.write(b"\xff" * ((hi - lo) * L * 2 // 2))  # half the stretch written, wrong
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        time.sleep(300)
        raise AssertionError("not killed")

    return dataclasses.replace(stream, read=read)


def test_a_worker_killed_mid_stretch_is_retried_to_the_same_bytes(tmp_path):
    """SIGKILL the worker that holds its stretch half written: the stretch runs again in a fresh
    process and the files are the uninterrupted export's bytes."""
    stream = _stream("concat")
    (tmp_path / "a").mkdir()
    write_tokens(stream, tmp_path / "a" / "tokens.bin", label_mask_path=tmp_path / "a" / "label_mask.bin")
    (tmp_path / "b").mkdir()
    claim, target = tmp_path / "claimed", tmp_path / "b" / "tokens.bin"
    stalling = dataclasses.replace(stream, opener=partial(stall_once, stream.opener, str(claim), str(target)))
    killed: list[int] = []

    def kill_the_stalled() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pid = claim.read_text() if claim.exists() else ""
            if pid:
                os.kill(int(pid), signal.SIGKILL)
                killed.append(int(pid))
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_the_stalled)
    watcher.start()
    write_tokens(stalling, target, label_mask_path=tmp_path / "b" / "label_mask.bin", writers=Writers(2))
    watcher.join()
    assert killed, "no worker was killed"
    _same_files(tmp_path / "a", tmp_path / "b")


@pytest.mark.integration
def test_a_local_ray_cluster_writes_the_same_bytes(tmp_path):
    """engine: ray writes each stretch as a Ray task on a real (one-node, local) cluster."""
    pytest.importorskip("ray")
    from pipeline.config import RayConfig
    from pipeline.distributed.local_cluster import local_cluster

    stream = _root_stream(tmp_path / "root", "concat")
    one = export_stream(stream, "megatron", tmp_path / "one", global_batch=G)
    with local_cluster([2]) as (address, _):
        on_ray = export_stream(stream, "megatron", tmp_path / "ray", global_batch=G, writers=Writers(2, "ray", RayConfig(address=address)))
    _same_files(one["dir"], on_ray["dir"])
