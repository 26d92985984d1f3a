"""Export an ordering to the trainers people use, in exactly Strata's order (issue 14).

The order is *which sequences form global batch b, and in which order the batches come*
(``batches.py``). Formats: ``numpy`` (raw flat tokens; nanoGPT, OLMo-core), ``megatron``
(indexed dataset + GPTDataset index cache), ``mds`` (MosaicML streaming, laid out for a world
size), ``hf`` (Parquet for ``datasets`` / the Trainer); ``torch_dataset`` reads a ``numpy`` export
for custom trainers. Every writer streams chunk by chunk; the output directory appears atomically.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.errors import StrataInputError
from pipeline.export.batches import check_batching
from pipeline.names import EXPORT_FORMATS
from pipeline.export.stream import OrderedStream, open_stream, stream_from_arrays
from pipeline.storage.atomic import atomic_dir

FORMATS = EXPORT_FORMATS

__all__ = ["FORMATS", "OrderedStream", "export_stream", "open_stream", "stream_from_arrays"]


def export_stream(stream: OrderedStream, fmt: str, out: str | Path, *, global_batch: int, world_size: int = 1,
                  workers: int = 1, meta: dict | None = None, progress=None) -> dict:
    """Write ``stream`` as ``fmt`` into the directory ``out`` (replaced atomically).

    ``meta`` (strategy, lineage) goes into ``meta.json`` with the batching. Returns a summary:
    files, sequences, tokens and wall seconds.
    """
    if fmt not in FORMATS:
        raise StrataInputError(f"unknown export format {fmt!r}", fix=f"use one of {list(FORMATS)}")
    check_batching(stream.n_sequences, global_batch, world_size, workers)
    info = {**(meta or {}), "global_batch": global_batch, "world_size": world_size, "workers": workers}
    t0 = time.perf_counter()
    out = Path(out)
    with atomic_dir(out) as tmp:
        if fmt == "numpy":
            from pipeline.export.numpy_tokens import export_numpy as write
        elif fmt == "megatron":
            from pipeline.export.megatron import export_megatron as write
        elif fmt == "hf":
            from pipeline.export.hf import export_hf as write
        if fmt == "mds":
            from pipeline.export.mds import export_mds

            files = export_mds(stream, tmp, info, global_batch=global_batch, world_size=world_size, progress=progress)
        else:
            files = write(stream, tmp, info, progress=progress)
        names = [f.relative_to(tmp) for f in files]
    return {
        "format": fmt, "dir": out, "files": [out / n for n in names], "sequences": stream.n_sequences,
        "tokens": stream.n_sequences * stream.seq_len, "wall_s": time.perf_counter() - t0,
    }


def export_ordering(layout, strategy: str, fmt: str, out: str | Path, *, seq_len: int, global_batch: int,
                    world_size: int = 1, workers: int = 1, progress=None) -> dict:
    """Export ``orderings/<strategy>.parquet`` of the data root ``layout`` (see ``export_stream``).

    ``meta.json`` records the lineage: the ordering and the segments it refers to (paths relative to the
    data root) with their SHA-256.
    """
    from pipeline.config import TRAINING_TIME_STRATEGIES
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.storage.atomic import file_sha256

    if strategy in TRAINING_TIME_STRATEGIES:
        raise StrataInputError(f"{strategy!r} picks its sequences online during training; it has no fixed order to export",
                               fix="export a scheduled strategy (random, greedy, ...)")
    tok = load_tokenizer(layout.tokenizer)
    stream = open_stream(layout, strategy, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, seq_len=seq_len)
    seg = layout.ordering_segments(strategy)
    seg = seg if seg.exists() else layout.segments
    meta = {  # paths relative to the data root, so the same inputs give the same bytes wherever the root lies
        "strategy": strategy,
        "lineage": {
            "ordering": layout.ordering(strategy).relative_to(layout.root).as_posix(),
            "ordering_sha256": file_sha256(layout.ordering(strategy)),
            "segments": seg.relative_to(layout.root).as_posix(), "segments_sha256": file_sha256(seg),
        },
    }
    return export_stream(stream, fmt, out, global_batch=global_batch, world_size=world_size, workers=workers,
                         meta=meta, progress=progress)
