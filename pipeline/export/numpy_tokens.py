"""``numpy`` export: the ordered sequences as one raw flat token file, nanoGPT / OLMo-core style.

``tokens.bin`` holds the sequences in training order, each exactly ``seq_len`` tokens (padding
included), no header, in the token dtype (``uint16`` when the vocabulary fits, else ``uint32``).
``label_mask.bin`` (one byte per token, parallel to it) is true where Strata's training scores the
token as a next-token target — a real token that does not start its document piece — OLMo-core's
``label_mask_paths`` format.
``segments.parquet`` gives the document boundaries by position (``position, seq_token_start,
n_tokens, doc_id, doc_token_start``; ``n_tokens`` counts an inserted EOS) and ``meta.json`` the
dtype, sequence length, count, EOS and pad ids, strategy and lineage.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.export.extend import Previous, copy_prefix
from pipeline.export.numpy_reader import open_numpy
from pipeline.export.pieces import Pieces, sequence_pieces
from pipeline.export.stretches import Writers, run_stretches, save_record
from pipeline.storage.atomic import write_json, write_parquet

if TYPE_CHECKING:  # the writers need polars and the data root; open_numpy (the reader) needs numpy only
    import polars as pl

    from pipeline.export.stream import OrderedStream


def ordered_segments(stream: OrderedStream) -> pl.DataFrame:
    """The segments table keyed by position instead of sequence id, in training order."""
    seg = stream.segments
    n = seg["n_tokens"].cast(pl.Int32)
    if "eos_added" in seg.columns:
        n = n + seg["eos_added"].cast(pl.Int32)
    seg = seg.with_columns(n_tokens=n).select("sequence_id", "seq_token_start", "n_tokens", "doc_id", "doc_token_start")
    pos = pl.DataFrame({"position": np.arange(stream.n_sequences, dtype=np.int64), "sequence_id": stream.order})
    return pos.join(seg, on="sequence_id").sort("position", "seq_token_start").drop("sequence_id")


def keep_prefix(stream: OrderedStream, previous: Previous, fh, mask_fh, check: DocumentCheck | None, progress=None) -> int:
    """Copy the first ``previous.sequences`` rows of the previous export's files named like ``fh``
    and ``mask_fh`` (the label mask, or None) into them; ``check`` sees the kept rows, and their
    label mask is re-derived from their pieces (a corrupt byte is not carried on). Tokens kept."""
    start, L = previous.sequences, stream.seq_len
    name, mask_name = Path(fh.name).name, None if mask_fh is None else Path(mask_fh.name).name
    if check is not None:
        old_mask = np.memmap(previous.dir / mask_name, dtype=np.uint8, mode="r") if mask_name is not None else None
        for lo, rows in previous.rows(name):
            lengths, is_doc = check.add(lo, rows)
            if old_mask is not None:
                want = label_mask(lengths, is_doc).view(np.uint8)
                have = np.asarray(old_mask[lo * L : lo * L + want.size])
                if have.size != want.size or (have != want).any():
                    at = lo + int(np.flatnonzero(have != want)[0]) // L if have.size == want.size else lo
                    raise StrataInputError(
                        f"the previous export's label mask differs from its kept prefix's documents at position {at}: "
                        "it is corrupt and is not carried into the new export", path=previous.dir / mask_name,
                        fix=f"export into a new directory, or delete {previous.dir} and export again (it is written whole)")
    copy_prefix(previous.dir / name, fh, start * L * np.dtype(stream.dtype).itemsize)
    if mask_fh is not None:
        copy_prefix(previous.dir / mask_name, mask_fh, start * L)
    if progress is not None:
        progress(start)
    return start * L


def write_tokens(stream: OrderedStream, path: Path, extra_tokens: np.ndarray | None = None, progress=None,
                 check: DocumentCheck | None = None, label_mask_path: Path | None = None,
                 previous: Previous | None = None, writers: Writers | None = None) -> int:
    """Write the ordered rows to ``path`` chunk by chunk (then ``extra_tokens``); tokens written.

    In the same pass ``check`` sees every chunk, and ``label_mask_path`` (if given) receives the
    rows' label mask (:func:`label_mask`). With ``previous`` (``pipeline/export/extend.py``) the
    first ``previous.sequences`` rows of both files are reused from the previous export's files of
    the same names, and only the rows after them are read from the stream. With ``writers`` of
    more than one, workers write contiguous stretches side by side (``stretches.py``): the same bytes."""
    written = 0
    if label_mask_path is not None and check is None:
        check = DocumentCheck(stream)
    if writers is not None and writers.n > 1:
        return write_in_stretches(stream, path, writers, extra_tokens=extra_tokens, progress=progress, check=check,
                                  label_mask_path=label_mask_path, previous=previous)
    masks = open(label_mask_path, "wb") if label_mask_path is not None else contextlib.nullcontext()
    start = 0 if previous is None else previous.sequences
    with open(path, "wb") as fh, masks as mask_fh:
        if previous is not None:
            written += keep_prefix(stream, previous, fh, mask_fh, check, progress)
        for lo, rows in stream.chunks(start=start):
            np.ascontiguousarray(rows, dtype=stream.dtype).tofile(fh)
            written += rows.size
            if check is not None:
                lengths, is_doc = check.add(lo, rows)
                if label_mask_path is not None:
                    label_mask(lengths, is_doc).tofile(mask_fh)
            if progress is not None:
                progress(rows.shape[0])
        if extra_tokens is not None:
            np.asarray(extra_tokens, dtype=stream.dtype).tofile(fh)
            written += int(np.size(extra_tokens))
    return written


def write_stretch(opener, tokens_path: str, mask_path: str | None, lo: int, hi: int, record: str) -> str:
    """Write positions ``[lo, hi)`` of the stream ``opener()`` opens into their byte ranges of the
    existing files ``tokens_path`` (and the label mask ``mask_path``), then ``record``: the stretch's
    count of sequences that are not EOS-delimited. Runs in a worker (``stretches.py``)."""
    stream = opener()
    check = DocumentCheck(stream, (lo, hi))
    item, L = np.dtype(stream.dtype).itemsize, stream.seq_len
    fd = os.open(tokens_path, os.O_WRONLY)
    mask_fd = os.open(mask_path, os.O_WRONLY) if mask_path is not None else None
    try:
        for first, rows in stream.chunks(start=lo, stop=hi):
            os.pwrite(fd, np.ascontiguousarray(rows, dtype=stream.dtype).tobytes(), first * L * item)
            lengths, is_doc = check.add(first, rows)
            if mask_fd is not None:
                os.pwrite(mask_fd, label_mask(lengths, is_doc).tobytes(), first * L)
    finally:
        os.close(fd)
        if mask_fd is not None:
            os.close(mask_fd)
    return save_record(record, {"lo": lo, "hi": hi, "not_eos_delimited": check.bad})


def write_in_stretches(stream: OrderedStream, path: Path, writers: Writers, *, extra_tokens: np.ndarray | None = None,
                       progress=None, check: DocumentCheck | None = None, label_mask_path: Path | None = None,
                       previous: Previous | None = None) -> int:
    """:func:`write_tokens` by ``writers.n`` workers (:func:`write_stretch` a stretch): the same files,
    the same bytes. This process sizes the files, copies a kept prefix and writes ``extra_tokens``;
    ``check`` gets the workers' counts. Tokens written."""
    if stream.opener is None:
        raise ValueError("export.writers > 1 needs a stream that a worker can open again (OrderedStream.opener)")
    m, L, item = stream.n_sequences, stream.seq_len, np.dtype(stream.dtype).itemsize
    extra = np.asarray([] if extra_tokens is None else extra_tokens, dtype=stream.dtype)
    masks = open(label_mask_path, "wb") if label_mask_path is not None else contextlib.nullcontext()
    with open(path, "wb") as fh, masks as mask_fh:
        if previous is not None:
            keep_prefix(stream, previous, fh, mask_fh, check, progress)
        fh.truncate(m * L * item + extra.nbytes)  # sparse until the workers write their ranges
        fh.seek(m * L * item)
        fh.write(extra.tobytes())
        if mask_fh is not None:
            mask_fh.truncate(m * L)
    mask = None if label_mask_path is None else str(label_mask_path)
    records = run_stretches(write_stretch, (stream.opener, str(path), mask), 0 if previous is None else previous.sequences, m,
                            writers, path.parent / f".{path.name}.stretches")
    for rec in records:
        if check is not None:
            check.bad += rec["not_eos_delimited"]
        if progress is not None:
            progress(rec["hi"] - rec["lo"])
    return m * L + extra.size


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


def stretch_pieces(stream: OrderedStream, stretch: tuple[int, int] | None) -> tuple[np.ndarray | None, Pieces]:
    """The document pieces of every sequence (``(None, pieces)``), or of the sequences at the
    positions ``stretch`` only: ``(their ids sorted, pieces by rank in them)``."""
    if stretch is None:
        return None, sequence_pieces(stream.segments, stream.seq_len)
    ids = np.unique(stream.order[stretch[0] : stretch[1]])
    seg = stream.segments
    sid = seg["sequence_id"].to_numpy()
    keep = np.isin(sid, ids)
    cols = {c: seg[c].to_numpy()[keep] for c in ("seq_token_start", "n_tokens", "eos_added") if c in seg.columns}
    return ids, sequence_pieces({"sequence_id": np.searchsorted(ids, sid[keep]), **cols}, stream.seq_len, n_sequences=ids.size)


class DocumentCheck:
    """Counts, chunk by chunk, the sequences whose documents EOS-based trainers would cut otherwise
    than Strata (:func:`not_eos_delimited`); ``result(fmt)`` is ``meta.json``'s ``document_masking``,
    with a loud warning (logged too) when there are any. The pieces are cut on the first chunk, of
    the positions ``stretch`` (``[lo, hi)``: a worker's) or of every sequence."""

    def __init__(self, stream: OrderedStream, stretch: tuple[int, int] | None = None):
        self.stream, self.stretch, self.bad = stream, stretch, 0
        self.ids: np.ndarray | None = None  # the stretch's sequence ids, sorted: the pieces' own ids are their ranks
        self._pieces: Pieces | None = None

    @property
    def pieces(self) -> Pieces:
        if self._pieces is None:
            self.ids, self._pieces = stretch_pieces(self.stream, self.stretch)
        return self._pieces

    def add(self, lo: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Check the rows at positions ``lo ..``; their pieces ``(lengths, is_doc)``."""
        pieces, ids = self.pieces, self.stream.order[lo : lo + rows.shape[0]]
        _, lengths, is_doc = pieces.of(ids if self.ids is None else np.searchsorted(self.ids, ids))
        self.bad += int(not_eos_delimited(rows, lengths, is_doc, self.stream.eos_id).sum())
        return lengths, is_doc

    def run(self) -> DocumentCheck:
        """Check the whole stream (for writers that read it in another order)."""
        for lo, rows in self.stream.chunks():
            self.add(lo, rows)
        return self

    def result(self, fmt: str) -> dict:
        warning = None
        if self.bad and fmt != "hf":
            exact = f"; {EXACT_READERS[fmt]} masks them exactly" if fmt in EXACT_READERS else ""
            warning = (f"{self.bad} of {self.stream.n_sequences} sequences hold a document boundary that is not an "
                       f"EOS (a document after padding, or cut mid-text): {EOS_READERS[fmt]} joins those documents, "
                       f"so such a trainer attends across them where Strata's training did not{exact} "
                       "(docs/export.md, 'Document masking')")
            logging.getLogger(__name__).warning("export %s: %s", fmt, warning)
        return {"eos_delimited": self.bad == 0, "not_eos_delimited_sequences": self.bad, "warning": warning}


def label_mask(lengths: np.ndarray, is_doc: np.ndarray) -> np.ndarray:
    """Flat bool mask of targets over rows cut into pieces ``lengths``/``is_doc``: real tokens that
    do not start their piece (nothing is predicted across documents, from or into padding)."""
    mask = np.repeat(is_doc, lengths)
    mask[np.cumsum(lengths) - lengths] = False
    return mask


def meta_of(stream: OrderedStream, fmt: str, extra: dict, check: DocumentCheck) -> dict:
    """``meta.json`` of an export; ``check`` has seen every sequence."""
    return {
        "format": fmt,
        "dtype": np.dtype(stream.dtype).name,
        "seq_len": stream.seq_len,
        "n_sequences": stream.n_sequences,
        "n_tokens": stream.n_sequences * stream.seq_len,
        "eos_id": int(stream.eos_id),
        "pad_id": int(stream.pad_id),
        "document_masking": check.result(fmt),
        **extra,
    }


def export_numpy(stream: OrderedStream, out: Path, meta: dict, progress=None, previous: Previous | None = None,
                 writers: Writers | None = None) -> list[Path]:
    check = DocumentCheck(stream)
    write_tokens(stream, out / "tokens.bin", progress=progress, check=check, label_mask_path=out / "label_mask.bin", previous=previous,
                 writers=writers)
    write_parquet(ordered_segments(stream), out / "segments.parquet")
    write_json(meta_of(stream, "numpy", meta, check), out / "meta.json")
    return [out / "tokens.bin", out / "label_mask.bin", out / "segments.parquet", out / "meta.json"]


__all__ = ["export_numpy", "open_numpy", "ordered_segments", "write_tokens"]
