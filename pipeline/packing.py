"""Packing documents into fixed-length training sequences.

``concat`` packing (the default, as in seed 000's setup): document token streams (each ending in
EOS) are concatenated in a given document order and cut every ``seq_len`` tokens. A segments
table records which span of which document fills which part of which sequence; it is the input
of the characteristic vectors c_s (seed 000, eq. for f1-f3) and of intra-document attention
masks. The incomplete last sequence is dropped and reported, never silently lost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError

SEGMENT_SCHEMA = {
    "sequence_id": pl.Int64,
    "seq_token_start": pl.Int32,
    "doc_id": pl.Int64,
    "doc_token_start": pl.Int64,
    "n_tokens": pl.Int32,
}


@dataclass(frozen=True)
class Packing:
    """Result of packing: the segments table and the token accounting."""

    segments: pl.DataFrame  # SEGMENT_SCHEMA, sorted by (sequence_id, seq_token_start)
    n_sequences: int
    seq_len: int
    tokens_in: int  # sum of document stream lengths (text tokens + one EOS each)
    tokens_packed: int  # n_sequences * seq_len
    tokens_dropped: int  # tail shorter than one sequence


def check_seq_len(seq_len: int) -> None:
    if not isinstance(seq_len, (int, np.integer)) or seq_len <= 1:
        raise StrataInputError(
            f"sequence length seq_len={seq_len!r} is impossible",
            fix="set seq_len to an integer >= 2 (e.g. 256 for CPU demos, 2048 at scale)",
        )


def pack_concat(doc_order: np.ndarray, stream_lengths: np.ndarray, seq_len: int) -> Packing:
    """Concatenate documents in ``doc_order`` and cut into ``seq_len``-token sequences.

    ``stream_lengths[d]`` is document d's token count including its EOS. Vectorized: each
    document is split into the pieces that fall into consecutive sequences.
    """
    check_seq_len(seq_len)
    doc_order = np.asarray(doc_order, dtype=np.int64)
    lengths = np.asarray(stream_lengths, dtype=np.int64)[doc_order]
    if lengths.size and lengths.min() <= 0:
        raise StrataInputError("a document has an empty token stream", fix="drop empty documents before packing")
    ends = np.cumsum(lengths)
    starts = ends - lengths
    total = int(ends[-1]) if ends.size else 0
    n_seq = total // seq_len
    cut = n_seq * seq_len
    keep = starts < cut
    d_ids, d_start, d_end = doc_order[keep], starts[keep], np.minimum(ends[keep], cut)
    first = d_start // seq_len
    last = (d_end - 1) // seq_len
    pieces = (last - first + 1).astype(np.int64)
    rep = np.repeat(np.arange(d_ids.size), pieces)
    k = np.arange(rep.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    seq = first[rep] + k
    p_start = np.maximum(d_start[rep], seq * seq_len)
    p_end = np.minimum(d_end[rep], (seq + 1) * seq_len)
    segments = pl.DataFrame(
        {
            "sequence_id": seq,
            "seq_token_start": (p_start - seq * seq_len).astype(np.int32),
            "doc_id": d_ids[rep],
            "doc_token_start": p_start - d_start[rep],
            "n_tokens": (p_end - p_start).astype(np.int32),
        },
        schema=SEGMENT_SCHEMA,
    )
    return Packing(segments, n_seq, seq_len, total, cut, total - cut)


class SequenceStore:
    """Random access to packed sequences: token matrix rows and their document segments.

    ``tokens`` is the flat token store (every document followed by EOS; may be a memmap) and
    ``doc_offsets[d]`` the start of document d in it. Only the requested tokens are read.
    """

    def __init__(self, tokens: np.ndarray, doc_offsets: np.ndarray, segments: pl.DataFrame, seq_len: int):
        seg = segments.sort(["sequence_id", "seq_token_start"])
        self.tokens, self.seq_len = tokens, seq_len
        self.sid = seg["sequence_id"].to_numpy()
        self.start = seg["seq_token_start"].to_numpy().astype(np.int64)
        self.n = seg["n_tokens"].to_numpy().astype(np.int64)
        self.src = np.asarray(doc_offsets, dtype=np.int64)[seg["doc_id"].to_numpy()] + seg["doc_token_start"].to_numpy()
        self.n_sequences = int(self.sid.max()) + 1 if self.sid.size else 0
        self.ptr = np.searchsorted(self.sid, np.arange(self.n_sequences + 1))

    def batch(self, sequence_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return ``(tokens (B, L) int64, segment_row (S,), segment_start (S,))`` for the batch."""
        ids = np.asarray(sequence_ids, dtype=np.int64)
        lo, hi = self.ptr[ids], self.ptr[ids + 1]
        counts = hi - lo
        sel = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        rows = np.repeat(np.arange(ids.size), counts)
        n, src = self.n[sel], self.src[sel]
        dst = rows * self.seq_len + self.start[sel]
        shift = np.repeat(np.cumsum(n) - n, n)
        idx = np.arange(int(n.sum()))
        out = np.zeros(ids.size * self.seq_len, dtype=np.int64)
        out[np.repeat(dst, n) + idx - shift] = np.asarray(self.tokens[np.repeat(src, n) + idx - shift])
        return out.reshape(ids.size, self.seq_len), rows, self.start[sel]


def sequence_tokens(
    tokens: np.ndarray, doc_offsets: np.ndarray, segments: pl.DataFrame, seq_len: int, sequence_ids: np.ndarray
) -> np.ndarray:
    """The (len(sequence_ids), seq_len) token matrix of the given sequences."""
    return SequenceStore(tokens, doc_offsets, segments, seq_len).batch(sequence_ids)[0]
