"""``mds`` export: MosaicML streaming shards laid out so ``StreamingDataset(shuffle=False)`` yields
Strata's global batches for a given world size.

Shards are byte-for-byte what ``MDSWriter(columns={"input_ids": "ndarray:<dtype>:<seq_len>"})``
writes (streaming 0.13 ``format/mds/writer.py``): ``[n: uint32][offsets: uint32 x (n+1)]
[config JSON][samples]``, a new shard when the next sample would pass ``size_limit`` (64 MiB),
and ``index.json`` (version 2) listing them.

Sample order. With ``shuffle=False``, one canonical node and one physical node, streaming's
partition (``partition/orig.py``) deals sample ids round-robin over the R ranks — rank r reads ids
r, R + r, 2R + r, ... — and cuts each rank's list into batches of B = G/R handed to the W
workers in turn, which is the order a ``DataLoader(batch_size=B, num_workers=W)`` returns them in.
So rank r's k-th sample is id ``k*R + r`` whatever W is, and it must hold position
``(k // B)*G + r*B + k % B``. The export writes id by id in that order. Only whole global batches
are written (``(M // G) * G`` sequences), as streaming would otherwise repeat samples to even out
ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.export.numpy_tokens import DocumentCheck, meta_of
from pipeline.export.stream import CHUNK_TOKENS, OrderedStream
from pipeline.storage.atomic import write_json

SIZE_LIMIT = 1 << 26  # MDSWriter's default shard size limit (bytes)
COLUMN = "input_ids"


def position_of_sample(ids: np.ndarray, global_batch: int, world_size: int) -> np.ndarray:
    """Ordering position stored at MDS sample id ``ids`` (see the module docstring)."""
    ids = np.asarray(ids, np.int64)
    b = global_batch // world_size
    rank, k = ids % world_size, ids // world_size
    return (k // b) * global_batch + rank * b + k % b


def shard_config(dtype: np.dtype, seq_len: int) -> dict:
    """The per-shard configuration MDSWriter records (and embeds in every shard)."""
    return {
        "version": 2, "format": "mds", "compression": None, "hashes": [], "size_limit": SIZE_LIMIT,
        "column_names": [COLUMN], "column_encodings": [f"ndarray:{np.dtype(dtype).name}:{seq_len}"],
        "column_sizes": [seq_len * np.dtype(dtype).itemsize],
    }


def export_mds(stream: OrderedStream, out: Path, meta: dict, *, global_batch: int, world_size: int, progress=None) -> list[Path]:
    L, dtype = stream.seq_len, np.dtype(stream.dtype)
    n = stream.n_sequences // global_batch * global_batch
    cfg = shard_config(dtype, L)
    cfg_bytes = json.dumps(cfg, sort_keys=True).encode("utf-8")
    sample_bytes = L * dtype.itemsize
    # MDSWriter flushes before a sample that would take the shard past size_limit
    per_shard = max(1, (SIZE_LIMIT - (8 + len(cfg_bytes))) // (sample_bytes + 4))
    rows_per_read = max(1, CHUNK_TOKENS // L)
    shards, files = [], []
    for s, lo in enumerate(range(0, n, per_shard)):
        count = min(per_shard, n - lo)
        name = f"shard.{s:05d}.mds"
        offsets = (4 + 4 * (count + 1) + len(cfg_bytes) + np.arange(count + 1, dtype=np.int64) * sample_bytes).astype(np.uint32)
        with open(out / name, "wb") as fh:
            fh.write(np.uint32(count).tobytes())
            fh.write(offsets.tobytes())
            fh.write(cfg_bytes)
            for a in range(lo, lo + count, rows_per_read):
                ids = np.arange(a, min(a + rows_per_read, lo + count))
                rows = stream.read(stream.order[position_of_sample(ids, global_batch, world_size)])
                np.ascontiguousarray(rows, dtype=dtype).tofile(fh)
                if progress is not None:
                    progress(ids.size)
        size = (out / name).stat().st_size
        shards.append({"samples": count, "raw_data": {"basename": name, "bytes": size, "hashes": {}}, "zip_data": None, **cfg})
        files.append(out / name)
    with open(out / "index.json", "w") as fh:
        json.dump({"version": 2, "shards": shards}, fh, sort_keys=True)
    files.append(out / "index.json")
    extra = {**meta, "n_written": n, "per_rank_batch": global_batch // world_size}
    files.append(write_json(meta_of(stream, "mds", extra, DocumentCheck(stream).run()), out / "meta.json"))
    return files
