"""The ordered stream an export writes: Strata's sequences in training order, read in chunks.

The order Strata promises is *which sequences form global batch b, and in which order the batches
come*: with global batch G, batch b holds positions ``[b*G, (b+1)*G)`` of ``orderings/<s>.parquet``.
Every exporter writes those positions in that order; world size and workers only matter for the
formats whose readers split batches themselves (MDS), see ``layout.py``.

Reading goes through the documented artifacts: ``SequenceStore`` over the token store and the
segments the ordering's ids refer to (``sequences/segments.parquet``, or
``orderings/<s>.segments.parquet`` for strategies that repack), the rows of a chunk gathered on a
thread a core. Only one chunk of rows is in memory at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.packing.pack import SequenceStore
from pipeline.packing.stored import packed_tokens
from pipeline.storage.layout import Layout, Store

CHUNK_TOKENS = 1 << 23  # rows read per chunk: about 8M tokens (16-32 MB of tokens in memory)


@dataclass(frozen=True)
class OrderedStream:
    """Sequences in training order: ``order[p]`` is the sequence id at position p."""

    order: np.ndarray  # (M,) int64 sequence ids
    segments: pl.DataFrame  # the segments table the ids refer to
    seq_len: int
    dtype: np.dtype  # token dtype of the store (uint16 when the vocabulary fits, else uint32)
    eos_id: int
    pad_id: int
    read: Callable[[np.ndarray], np.ndarray]  # sequence ids -> (n, L) tokens in ``dtype``

    @property
    def n_sequences(self) -> int:
        return int(self.order.size)

    def chunks(self, chunk_tokens: int = CHUNK_TOKENS, start: int = 0) -> Iterator[tuple[int, np.ndarray]]:
        """``(first position, tokens (n, L))`` for consecutive runs of positions from ``start``."""
        rows = max(1, chunk_tokens // self.seq_len)
        for lo in range(start, self.n_sequences, rows):
            yield lo, self.read(self.order[lo : lo + rows])


def open_stream(layout: Layout, strategy: str, *, eos_id: int, pad_id: int, seq_len: int | None = None) -> OrderedStream:
    """The ordered stream of ``strategy`` under the data root ``layout`` (a ``seq_len`` given must
    be the sequences artifact's own)."""
    store = Store(layout)
    ordering = store.ordering(strategy)
    segments = ordering.segments
    packed_len = store.sequences.seq_len
    if seq_len is not None and seq_len != packed_len:
        n_seq = int(segments["sequence_id"].max()) + 1 if segments.height else 0
        raise StrataInputError(f"the sequences are {n_seq} x seq_len {packed_len}, not x seq_len {seq_len}",
                               path=store.sequences.segments_path,
                               fix="leave seq_len to the sequences artifact, or rematerialize sequences")
    tokens, offsets = packed_tokens(layout)
    packed = SequenceStore(tokens, offsets, segments, packed_len, pad_id=pad_id)
    return OrderedStream(ordering.order, segments, packed_len, tokens.dtype, eos_id, pad_id, packed.rows)


def stream_from_arrays(tokens: np.ndarray, doc_offsets: np.ndarray, segments: pl.DataFrame, order: np.ndarray,
                       seq_len: int, *, eos_id: int, pad_id: int) -> OrderedStream:
    """An ordered stream over in-memory (or memory-mapped) artifacts, for tests and library use."""
    store = SequenceStore(tokens, doc_offsets, segments, seq_len, pad_id=pad_id)
    dtype = np.dtype(tokens.dtype)
    return OrderedStream(np.asarray(order, np.int64), segments, seq_len, dtype, eos_id, pad_id, store.rows)


@dataclass(frozen=True)
class Pieces:
    """Document pieces of every sequence: sequence s spans ``length[ptr[s]:ptr[s+1]]`` (summing to
    L), each piece one document span (with its inserted EOS) or a run of padding (``is_doc`` false)."""

    ptr: np.ndarray  # (n_sequences + 1,) int64, by sequence id
    length: np.ndarray  # int32
    is_doc: np.ndarray  # bool

    def of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(counts per sequence, lengths, is_doc)`` of the pieces of ``ids``, concatenated in order."""
        ids = np.asarray(ids, np.int64)
        lo, hi = self.ptr[ids], self.ptr[ids + 1]
        counts = hi - lo
        sel = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        return counts, self.length[sel], self.is_doc[sel]


def sequence_pieces(segments: pl.DataFrame, seq_len: int) -> Pieces:
    """Cut every sequence at its document boundaries (segment starts and ends) and at padding."""
    sid = segments["sequence_id"].to_numpy().astype(np.int64)
    start = segments["seq_token_start"].to_numpy().astype(np.int64)
    ext = segments["n_tokens"].to_numpy().astype(np.int64)
    if "eos_added" in segments.columns:
        ext = ext + segments["eos_added"].to_numpy().astype(np.int64)
    m = int(sid.max()) + 1 if sid.size else 0
    width = seq_len + 1
    every = np.arange(m, dtype=np.int64) * width
    keys = np.unique(np.concatenate([every, every + seq_len, sid * width + start, sid * width + start + ext]))
    s, b = keys // width, keys % width
    same = s[1:] == s[:-1]
    owner, begin = s[:-1][same], b[:-1][same]
    length = (b[1:] - b[:-1])[same]
    doc_starts = np.unique(sid * width + start)
    is_doc = np.isin(owner * width + begin, doc_starts)
    ptr = np.searchsorted(owner, np.arange(m + 1))
    return Pieces(ptr.astype(np.int64), length.astype(np.int32), is_doc)


def positions_in_pieces(lengths: np.ndarray) -> np.ndarray:
    """Position ids restarting at 0 at the start of every piece (flat, ``lengths.sum()`` long)."""
    total = int(lengths.sum())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return (np.arange(total, dtype=np.int64) - starts).astype(np.int32)
