"""Flat token files written by several workers side by side, into the one output (issue 55).

Every exported sequence is exactly ``seq_len`` tokens, so position p's tokens start at byte
``p * seq_len * itemsize`` of ``tokens.bin`` (``numpy`` and ``megatron``) and its label mask at byte
``p * seq_len`` of ``label_mask.bin``: the layout is known before a token is read. The driver
creates the files at their final size (sparse), copies a kept frozen prefix and writes the trailing
tokens (Megatron's last EOS); the positions after it are cut into ``writers`` contiguous stretches,
each written by a worker (``numpy_tokens.write_stretch``, run by :func:`pipeline.distributed.engine.map_tasks`: a process of its own with
``engine: local``, a Ray task with ``engine: ray``, the output then on a filesystem every worker
shares) straight into its byte range with ``os.pwrite``. A worker reopens the stream itself
(``OrderedStream.opener``): nothing but positions and paths goes through the driver. It leaves a
small record (its count of sequences that are not EOS-delimited, for ``meta.json``) when its
stretch is whole; a worker that dies has none, and its stretch is written again, the same bytes
into the same range. The bytes are the single writer's (``tests/test_export_writers.py``): rows
never depend on their neighbours, only on their position.

The formats whose layout is not a function of the position alone stay single-writer: ``mds``
(shards cut by their byte sizes, with their own ``index.json``) and ``hf`` (Parquet row groups,
compressed).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pipeline.distributed.engine import map_tasks
from pipeline.distributed.shards import Shard


@dataclass(frozen=True)
class Writers:
    """How many workers write a flat export's stretches, and where they run (``export.writers``)."""

    n: int = 1
    engine: str = "local"  # local: a worker process a stretch; ray: a Ray task a stretch
    ray_cfg: Any = None  # pipeline.config.RayConfig, for engine: ray


def stretch_bounds(start: int, stop: int, n: int) -> list[tuple[int, int]]:
    """``n`` contiguous stretches ``[lo, hi)`` covering ``[start, stop)``, sizes differing by at most one (none empty)."""
    edges = np.linspace(start, stop, max(1, min(n, stop - start)) + 1).round().astype(np.int64)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def save_record(record: str, payload: dict) -> str:
    """Write a stretch's record (JSON) atomically: present = the stretch is whole. Returns ``record``."""
    tmp = Path(f"{record}.tmp")
    tmp.write_text(json.dumps(payload), encoding="utf-8")
    os.replace(tmp, record)
    return record


def run_stretches(worker: Callable[..., str], args: tuple, start: int, stop: int, writers: Writers, work: Path) -> list[dict]:
    """``worker(*args, lo, hi, record)`` for the ``writers.n`` stretches of ``[start, stop)``, side by
    side on ``writers.engine`` (a worker that dies is run again); each worker saves its ``record``
    under ``work`` (:func:`save_record`). Returns the records in position order; ``work`` is removed."""
    work.mkdir(parents=True, exist_ok=True)
    bounds = stretch_bounds(start, stop, writers.n)
    shards = [Shard(f"export stretch {i} [{lo}, {hi})", (*args, lo, hi, str(work / f"{i:05d}.json")), (work / f"{i:05d}.json",))
              for i, (lo, hi) in enumerate(bounds)]
    retries = writers.ray_cfg.max_retries if writers.ray_cfg is not None else 3
    map_tasks(worker, shards, engine=writers.engine, ray_cfg=writers.ray_cfg, workers=max(1, len(shards)), retries=retries)
    records = [json.loads(shard.outputs[0].read_text(encoding="utf-8")) for shard in shards]
    shutil.rmtree(work)
    return records
