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

from pipeline.export.stream import OrderedStream, sequence_pieces
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


EOS_READERS = {  # how each format's trainers find documents: by the EOS tokens in the stream
    "numpy": "OLMo-core's generate_doc_lengths", "megatron": "Megatron's reset_attention_mask / reset_position_ids",
    "mds": "a document mask built from EOS tokens",
}
EXACT_READERS = {"numpy": "pipeline.export.torch_dataset", "hf": "the seq_lengths column"}


def not_eos_delimited(rows: np.ndarray, lengths: np.ndarray, is_doc: np.ndarray, eos_id: int) -> np.ndarray:
    """Per row of ``rows`` (n, L): whether cutting it after every EOS, as EOS-based trainers do,
    splits its real tokens otherwise than Strata's document pieces (``lengths``/``is_doc`` of the
    rows' pieces in order, summing to L per row): a piece not preceded by EOS (after padding, or a
    document cut mid-text), or an EOS inside a piece."""
    n, L = rows.shape
    piece_start = np.zeros(n * L, bool)
    piece_start[np.cumsum(lengths) - lengths] = True
    after_eos = np.ones((n, L), bool)
    after_eos[:, 1:] = rows[:, :-1] == eos_id
    differ = (piece_start != after_eos.reshape(-1)) & np.repeat(is_doc, lengths)
    return differ.reshape(n, L).any(axis=1)


def document_masking(stream: OrderedStream, fmt: str) -> dict:
    """Whether EOS-based trainers reproduce Strata's document masking on this stream; a loud
    warning (logged, and kept in ``meta.json``) when some sequences they would attend across."""
    import logging

    pieces = sequence_pieces(stream.segments, stream.seq_len)
    bad = 0
    for lo, rows in stream.chunks():
        _, lengths, is_doc = pieces.of(stream.order[lo : lo + rows.shape[0]])
        bad += int(not_eos_delimited(rows, lengths, is_doc, stream.eos_id).sum())
    warning = None
    if bad and fmt != "hf":
        exact = f"; {EXACT_READERS[fmt]} masks them exactly" if fmt in EXACT_READERS else ""
        warning = (f"{bad} of {stream.n_sequences} sequences hold a document boundary that is not an EOS "
                   f"(a document after padding, or cut mid-text): {EOS_READERS[fmt]} joins those documents, so such "
                   f"a trainer attends across them where Strata's training did not{exact} (docs/export.md, "
                   "'Document masking')")
        logging.getLogger(__name__).warning("export %s: %s", fmt, warning)
    return {"eos_delimited": bad == 0, "not_eos_delimited_sequences": bad, "warning": warning}


def meta_of(stream: OrderedStream, fmt: str, extra: dict) -> dict:
    return {
        "format": fmt,
        "dtype": np.dtype(stream.dtype).name,
        "seq_len": stream.seq_len,
        "n_sequences": stream.n_sequences,
        "n_tokens": stream.n_sequences * stream.seq_len,
        "eos_id": int(stream.eos_id),
        "pad_id": int(stream.pad_id),
        "document_masking": document_masking(stream, fmt),
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
