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
from functools import partial
from typing import Callable, Iterator

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.export.pieces import Pieces, positions_in_pieces, sequence_pieces  # noqa: F401 (their home before pieces.py)
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
    opener: Callable[[], OrderedStream] | None = None  # picklable: opens this stream again in another process (stretches.py)

    @property
    def n_sequences(self) -> int:
        return int(self.order.size)

    def chunks(self, chunk_tokens: int = CHUNK_TOKENS, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """``(first position, tokens (n, L))`` for consecutive runs of positions from ``start`` to ``stop``."""
        rows = max(1, chunk_tokens // self.seq_len)
        stop = self.n_sequences if stop is None else min(stop, self.n_sequences)
        for lo in range(start, stop, rows):
            yield lo, self.read(self.order[lo : min(lo + rows, stop)])


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
    again = partial(open_stream, Layout(layout.root), strategy, eos_id=eos_id, pad_id=pad_id, seq_len=packed_len)
    return OrderedStream(ordering.order, segments, packed_len, tokens.dtype, eos_id, pad_id, packed.rows, again)


def stream_from_arrays(tokens: np.ndarray, doc_offsets: np.ndarray, segments: pl.DataFrame, order: np.ndarray,
                       seq_len: int, *, eos_id: int, pad_id: int) -> OrderedStream:
    """An ordered stream over in-memory (or memory-mapped) artifacts, for tests and library use (its
    ``opener`` carries the arrays to a worker process: pickled whole)."""
    store = SequenceStore(tokens, doc_offsets, segments, seq_len, pad_id=pad_id)
    dtype = np.dtype(tokens.dtype)
    again = partial(stream_from_arrays, tokens, doc_offsets, segments, order, seq_len, eos_id=eos_id, pad_id=pad_id)
    return OrderedStream(np.asarray(order, np.int64), segments, seq_len, dtype, eos_id, pad_id, store.rows, again)
