"""``numpy`` export: the ordered sequences as one raw flat token file, nanoGPT / OLMo-core style.

``tokens.bin`` holds the sequences in training order, each exactly ``seq_len`` tokens (padding
included), no header, in the token dtype (``uint16`` when the vocabulary fits, else ``uint32``).
``segments.parquet`` gives the document boundaries by position (``position, seq_token_start,
n_tokens, doc_id, doc_token_start``; ``n_tokens`` counts an inserted EOS) and ``meta.json`` the
dtype, sequence length, count, EOS and pad ids, strategy and lineage.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from pipeline.export.stream import OrderedStream
from pipeline.storage.atomic import write_json, write_parquet


def ordered_segments(stream: OrderedStream) -> pl.DataFrame:
    """The segments table keyed by position instead of sequence id, in training order."""
    seg = stream.segments
    n = seg["n_tokens"].cast(pl.Int32)
    if "eos_added" in seg.columns:
        n = n + seg["eos_added"].cast(pl.Int32)
    seg = seg.with_columns(n_tokens=n).select("sequence_id", "seq_token_start", "n_tokens", "doc_id", "doc_token_start")
    pos = pl.DataFrame({"position": np.arange(stream.n_sequences, dtype=np.int64), "sequence_id": stream.order})
    return pos.join(seg, on="sequence_id").sort("position", "seq_token_start").drop("sequence_id")


def write_tokens(stream: OrderedStream, path: Path, extra_tokens: np.ndarray | None = None, progress=None) -> int:
    """Append the ordered rows to ``path`` chunk by chunk (then ``extra_tokens``); tokens written."""
    written = 0
    with open(path, "wb") as fh:
        for _, rows in stream.chunks():
            np.ascontiguousarray(rows, dtype=stream.dtype).tofile(fh)
            written += rows.size
            if progress is not None:
                progress(rows.shape[0])
        if extra_tokens is not None:
            np.asarray(extra_tokens, dtype=stream.dtype).tofile(fh)
            written += int(np.size(extra_tokens))
    return written


def meta_of(stream: OrderedStream, fmt: str, extra: dict) -> dict:
    return {
        "format": fmt,
        "dtype": np.dtype(stream.dtype).name,
        "seq_len": stream.seq_len,
        "n_sequences": stream.n_sequences,
        "n_tokens": stream.n_sequences * stream.seq_len,
        "eos_id": int(stream.eos_id),
        "pad_id": int(stream.pad_id),
        **extra,
    }


def export_numpy(stream: OrderedStream, out: Path, meta: dict, progress=None) -> list[Path]:
    write_tokens(stream, out / "tokens.bin", progress=progress)
    write_parquet(ordered_segments(stream), out / "segments.parquet")
    write_json(meta_of(stream, "numpy", meta), out / "meta.json")
    return [out / "tokens.bin", out / "segments.parquet", out / "meta.json"]


def open_numpy(export_dir: str | Path) -> tuple[np.memmap, dict]:
    """Memory-map a ``numpy`` export: ``(tokens (n_sequences, seq_len), meta)``."""
    import json

    d = Path(export_dir)
    meta = json.loads((d / "meta.json").read_text(encoding="utf-8"))
    tokens = np.memmap(d / "tokens.bin", dtype=meta["dtype"], mode="r", shape=(meta["n_sequences"], meta["seq_len"]))
    return tokens, meta
