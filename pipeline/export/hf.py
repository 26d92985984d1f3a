"""``hf`` export: Parquet shards for Hugging Face ``datasets`` and the Trainer, in training order.

Each row is one sequence at its position: ``input_ids`` (``seq_len`` int32), ``position_ids``
(restarting at 0 at every document piece and at a padding run) and ``seq_lengths`` (the piece
lengths, summing to ``seq_len``) — the columns of TRL's padding-free packing, which
``DataCollatorWithFlattening``-style collators turn into per-document attention. Shards are
``data/train-XXXXX-of-YYYYY.parquet``; ``load_dataset(DIR, split="train")`` reads them in name
order, so row i is position i. Read with ``train_sampling_strategy="sequential"`` (see
docs/export.md): the Trainer then takes rows in order and accelerate gives rank r the r-th
per-device slice of every global batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.export.numpy_tokens import DocumentCheck, meta_of
from pipeline.export.pieces import positions_in_pieces
from pipeline.export.stream import OrderedStream
from pipeline.storage.atomic import write_json

SHARD_TOKENS = 1 << 27  # about 134M tokens per shard


def export_hf(stream: OrderedStream, out: Path, meta: dict, progress=None) -> list[Path]:
    L, m = stream.seq_len, stream.n_sequences
    check = DocumentCheck(stream)
    per_shard = max(1, SHARD_TOKENS // L)
    n_shards = max(1, -(-m // per_shard))
    schema = pa.schema([
        ("input_ids", pa.list_(pa.int32(), L)),
        ("position_ids", pa.list_(pa.int32(), L)),
        ("seq_lengths", pa.list_(pa.int32())),
    ])
    (out / "data").mkdir(parents=True, exist_ok=True)
    files = []
    chunks = stream.chunks()
    pending: tuple[int, np.ndarray] | None = None
    for s in range(n_shards):
        path = out / "data" / f"train-{s:05d}-of-{n_shards:05d}.parquet"
        hi = min(m, (s + 1) * per_shard)
        with pq.ParquetWriter(path, schema, compression="zstd", compression_level=1,
                              use_dictionary=False, write_statistics=False) as w:
            while True:
                lo, rows = pending if pending is not None else next(chunks, (m, None))
                pending = None
                if rows is None:
                    break
                if lo + rows.shape[0] > hi:  # the chunk crosses into the next shard
                    pending = (hi, rows[hi - lo :])
                    rows = rows[: hi - lo]
                counts, lengths, _ = check.pieces.of(stream.order[lo : lo + rows.shape[0]])
                check.add(lo, rows)
                flat = pa.array(np.ascontiguousarray(rows, dtype=np.int32).reshape(-1))
                pos = pa.array(positions_in_pieces(lengths))
                offs = np.zeros(counts.size + 1, np.int32)
                np.cumsum(counts, out=offs[1:])
                w.write_table(pa.table({
                    "input_ids": pa.FixedSizeListArray.from_arrays(flat, L),
                    "position_ids": pa.FixedSizeListArray.from_arrays(pos, L),
                    "seq_lengths": pa.ListArray.from_arrays(pa.array(offs), pa.array(lengths.astype(np.int32))),
                }, schema=schema))
                if progress is not None:
                    progress(rows.shape[0])
                if pending is not None or lo + rows.shape[0] >= hi:
                    break
        files.append(path)
    files.append(write_json(meta_of(stream, "hf", meta, check), out / "meta.json"))
    return files
