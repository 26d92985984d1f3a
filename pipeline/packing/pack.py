"""Packing documents into fixed-length training sequences: concat, padding, atom shuffles, best-fit.

Every document d has a *stream* of ``stream_lengths[d]`` tokens in the flat token store: its text
tokens followed by one EOS. A packing is a segments table: one row per span of one document placed
in one sequence. Rows keep document boundaries, which feed intra-document attention masks and the
characteristic vectors c_s of Don't Shuffle, Optimize. Variants (Packing & shuffling, appendix A.3, with MSL = ``seq_len``):

- ``concat``: streams joined in ``doc_order`` and cut every MSL tokens; the incomplete tail is
  dropped and reported. With ``atom_multiple`` the joined stream is first cut into atoms of
  A = atom_multiple x MSL tokens, the atoms are shuffled (seeded) and re-joined, then cut every
  MSL tokens: A < MSL merges MSL/A atoms per sequence, A > MSL splits each atom into A/MSL
  consecutive sequences. Only whole atoms and whole sequences are kept (the stream is truncated to
  a multiple of max(A, MSL)); the rest is reported as dropped.
- ``padding``: each document is cut into pieces of A-1 text tokens followed by an EOS; the last
  piece holds the remaining text and the document's own EOS. Pieces are (with ``atom_multiple``)
  shuffled, then laid out in slots: for A <= MSL every piece is padded to A and MSL/A slots are
  merged into one sequence; for A > MSL a piece is padded to the next multiple of MSL (never to A,
  as A.3 prescribes, so no sequence is all padding) and split into MSL-token sequences. Without
  ``atom_multiple``, A = MSL and pieces keep ``doc_order``. Nothing is dropped; the last sequence
  is padded.
- ``best_fit``: documents longer than MSL give floor(len/MSL) full MSL-token sequences; every
  remainder (and every short document) is an item of best-fit-decreasing bin packing into
  MSL-token bins. No document shorter than MSL is cut; unused bin space is padding.

Inserted EOS tokens (``padding``) are not in the token store: a segment with ``eos_added`` true is
followed in its sequence by one extra EOS, read from the document's own final store token. Thus
every store token is placed at most once (exactly once unless reported as dropped), and
``tokens_packed = tokens_in - tokens_dropped + tokens_eos_added + tokens_padding`` holds exactly.
Sequence positions covered by no segment (nor inserted EOS) are padding: ``SequenceStore`` fills
them with ``pad_id`` and reports them in its ``filled`` mask, which the loss must respect.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
from numba import njit, prange

from pipeline.errors import StrataInputError
from pipeline.names import ATOM_MULTIPLES, PACKING_SPECS, packing_name  # declared for the config
from pipeline.names import PACKING_VARIANTS as VARIANTS
from pipeline.segments import docs_per_sequence, even_cuts, grouped, n_chunks
from pipeline.storage.atomic import atomic_path
from pipeline.threads import parallel_map, task_size

SEGMENT_SCHEMA = {
    "sequence_id": pl.Int64,
    "seq_token_start": pl.Int32,
    "doc_id": pl.Int64,
    "doc_token_start": pl.Int64,
    "n_tokens": pl.Int32,
}
# ``pack`` adds one column: an EOS not in the token store follows the segment in its sequence.
PACKED_SEGMENT_SCHEMA = {**SEGMENT_SCHEMA, "eos_added": pl.Boolean}


@dataclass(frozen=True)
class Packing:
    """Result of packing: the segments table and the token accounting."""

    segments: pl.DataFrame | None  # PACKED_SEGMENT_SCHEMA, sorted by (sequence_id, seq_token_start); None: in its file
    n_sequences: int
    seq_len: int
    tokens_in: int  # sum of the packed documents' stream lengths (text tokens + one EOS each)
    tokens_packed: int  # n_sequences * seq_len
    tokens_dropped: int  # store tokens placed in no sequence
    variant: str = "concat"
    atom: int | None = None  # atom size A in tokens, None without atom shuffling
    tokens_eos_added: int = 0  # EOS tokens inserted after padding pieces (not in the store)
    tokens_padding: int = 0  # sequence positions holding no token


def check_seq_len(seq_len: int) -> None:
    if not isinstance(seq_len, (int, np.integer)) or seq_len <= 1:
        raise StrataInputError(
            f"sequence length seq_len={seq_len!r} is impossible",
            fix="set seq_len to an integer >= 2 (e.g. 256 for CPU demos, 2048 at scale)",
        )


def parse_packing(spec: str) -> tuple[str, float | None]:
    """Inverse of ``packing_name``: ``"padding-x0.5"`` -> ``("padding", 0.5)``."""
    variant, sep, mult = spec.partition("-x")
    try:
        atom = float(mult) if sep else None
    except ValueError:
        atom = -1.0
    if variant not in VARIANTS or (atom is not None and (atom <= 0 or variant == "best_fit")):
        raise StrataInputError(
            f"unknown packing {spec!r}",
            fix=f"use one of {list(PACKING_SPECS)} (variant[-x<atom size as a multiple of seq_len>])",
        )
    return variant, atom


def pack_concat(doc_order: np.ndarray, stream_lengths: np.ndarray, seq_len: int) -> Packing:
    """Concatenate documents in ``doc_order`` and cut into ``seq_len``-token sequences."""
    return pack("concat", doc_order, stream_lengths, seq_len)


def pack(
    variant: str,
    doc_order: np.ndarray,
    stream_lengths: np.ndarray,
    seq_len: int,
    *,
    atom_multiple: float | None = None,
    seed: int = 0,
) -> Packing:
    """Pack the documents of ``doc_order`` (unique doc ids) with one of ``VARIANTS``.

    ``stream_lengths[d]`` is document d's token count including its EOS. ``atom_multiple`` (Packing &
    shuffling's atom size as a multiple of MSL) turns on the seeded atom shuffle of ``concat`` and
    ``padding``; the atom A = atom_multiple x seq_len must be an integer that divides or is a
    multiple of ``seq_len``. ``seed`` drives every shuffle (atoms; best-fit sequence ids).
    """
    check_seq_len(seq_len)
    L = int(seq_len)
    if variant not in VARIANTS:
        raise StrataInputError(f"unknown packing variant {variant!r}", fix=f"use one of {list(VARIANTS)}")
    order, all_lengths, tokens_in = _check_docs(doc_order, stream_lengths)
    atom = None if atom_multiple is None else _atom_size(variant, atom_multiple, L)
    rng = np.random.default_rng(seed)
    if variant == "concat" and atom is None:
        rows, n_seq = _concat_plain(order, all_lengths, L, tokens_in)
    elif variant == "concat":
        rows, n_seq = _concat(order, all_lengths[order], L, atom, rng)
    elif variant == "padding":
        rows, n_seq = _padding(order, all_lengths[order], L, L if atom is None else atom, rng if atom is not None else None)
    else:
        rows, n_seq = _best_fit(order, all_lengths[order], L, rng)
    segments = _segments(*_merge(*rows))
    del rows
    kept = int(segments["n_tokens"].cast(pl.Int64).sum() or 0)  # Int32 sums wrap past 2^31 tokens
    eos = int(segments["eos_added"].sum() or 0)
    packed = n_seq * L
    return Packing(segments, n_seq, L, tokens_in, packed, tokens_in - kept, variant, atom, eos, packed - kept - eos)


def narrow_lengths(lengths: np.ndarray) -> np.ndarray:
    """Stream lengths as int32 when every one fits (a document under 2^31 tokens): 4 bytes a
    document for the streamed packing and its check instead of 8; else as they are."""
    lengths = np.asarray(lengths)
    return lengths.astype(np.int32) if lengths.size == 0 or int(lengths.max()) < 2**31 else lengths


def _check_docs(doc_order: np.ndarray, stream_lengths: np.ndarray, narrow: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """Validated ``doc_order`` (int64, not copied when it is already), the stream lengths of all
    documents (int64; with ``narrow``, int32 lengths are kept as they are) and the sum of those of
    ``doc_order`` (no per-order copy of the lengths), checked in one pass (:func:`_scan_order`)."""
    all_lengths = np.asarray(stream_lengths)
    order = np.asarray(doc_order)
    if order.ndim != 1 or all_lengths.ndim != 1 or (order.size and not np.issubdtype(order.dtype, np.integer)):
        raise StrataInputError("doc_order and stream_lengths must be 1-D integer arrays",
                               fix="pass doc ids and per-document stream lengths")
    order = order.astype(np.int64, copy=False)
    if not (narrow and all_lengths.dtype == np.int32):
        all_lengths = all_lengths.astype(np.int64, copy=False)
    outside, repeated, total, smallest = _scan_order(order, all_lengths)
    if outside:
        raise StrataInputError(
            f"doc_order holds ids outside 0..{all_lengths.size - 1}", fix="pass dense doc ids (row indices of documents.parquet)"
        )
    if repeated:
        raise StrataInputError("doc_order repeats a document", fix="pass each document at most once (a permutation or a subset)")
    if order.size and smallest <= 0:
        raise StrataInputError("a document has an empty token stream", fix="drop empty documents before packing")
    return order, all_lengths, int(total)


@njit(cache=True)
def _scan_order(order: np.ndarray, lengths: np.ndarray) -> tuple[bool, bool, int, int]:
    """Whether ``order`` holds an id outside ``lengths``, whether it repeats one, and the sum and
    minimum of ``lengths[order]`` over the ids inside (the minimum is 1 for an empty order)."""
    seen = np.zeros(lengths.size, np.bool_)
    outside, repeated, total, smallest, first = False, False, 0, 1, True
    for i in range(order.size):
        d = order[i]
        if d < 0 or d >= lengths.size:
            outside = True
            continue
        repeated |= seen[d]
        seen[d] = True
        x = lengths[d]
        total += x
        if first or x < smallest:
            smallest, first = x, False
    return outside, repeated, total, smallest


def _atom_size(variant: str, atom_multiple: float, L: int) -> int:
    """Atom size in tokens; Packing & shuffling uses A in {0.25, 0.5, 1, 2, 4} x MSL."""
    if variant == "best_fit":
        raise StrataInputError("best_fit packing takes no atom size", fix="drop atom_multiple, or use concat/padding")
    a = float(atom_multiple) * L
    atom = int(round(a))
    fits = a > 0 and abs(a - atom) < 1e-9 and (L % atom == 0 or atom % L == 0)
    if not fits or (variant == "padding" and atom < 2):
        raise StrataInputError(
            f"atom size {atom_multiple!r} x seq_len {L} = {a:g} tokens does not tile the sequence length",
            fix=f"choose atom_multiple so the atom is an integer >= 2 dividing or multiple of {L} (Packing & shuffling: "
                f"{list(ATOM_MULTIPLES)})",
        )
    return atom


def _cut(start, length, doc, doc_start, eos, L: int):
    """Split stream spans ``[start, start+length)`` at multiples of ``L``.

    Returns per piece (sequence int64, offset in it int32, doc int64, doc start int64, store tokens
    int32, eos_added); the extra EOS of a span (its last position when ``eos``) stays with the
    piece holding that position. The pieces are written straight into the six arrays (numba):
    no per-piece temporaries.
    """
    start = np.asarray(start, np.int64)
    length = np.asarray(length, np.int64)
    total = int(((start + length - 1) // L - start // L + 1).sum()) if start.size else 0
    out = _piece_arrays(total)
    _cut_into(start, length, np.asarray(doc, np.int64), np.asarray(doc_start, np.int64), np.asarray(eos, np.bool_), L, *out)
    return out


def _piece_arrays(total: int) -> tuple:
    return (np.empty(total, np.int64), np.empty(total, np.int32), np.empty(total, np.int64), np.empty(total, np.int64),
            np.empty(total, np.int32), np.zeros(total, np.bool_))


@njit(cache=True)
def _cut_into(start, length, doc, doc_start, eos, L, seq, off, d, ds, n, e) -> None:
    w = 0
    for i in range(start.size):
        s, end = start[i], start[i] + length[i]
        for q in range(s // L, (end - 1) // L + 1):
            lo, hi = max(s, q * L), min(end, (q + 1) * L)
            x = eos[i] and hi == end
            seq[w], off[w], d[w], ds[w], n[w], e[w] = q, lo - q * L, doc[i], doc_start[i] + lo - s, hi - lo - x, x
            w += 1


def _concat_plain(order: np.ndarray, all_lengths: np.ndarray, L: int, total: int):
    """``concat`` without atoms: the documents of ``order`` joined and cut every ``L`` tokens, the
    incomplete tail dropped; the same pieces as cutting ``_stream_spans`` with ``_cut``, written
    straight from the order (no per-document copies), in chunks of documents on every core: each
    chunk's stream position and first piece come from the chunks before it."""
    keep = total // L * L
    lengths = all_lengths[order]  # gathered once, read in order by every pass (not one cache miss a document each)
    return _concat_span(order, lengths, L, keep, 0), keep // L


def _concat_span(order: np.ndarray, lengths: np.ndarray, L: int, keep: int, start: int) -> tuple:
    """The pieces of documents ``order`` (``lengths``: theirs), the first starting at stream
    position ``start``, of the joined stream truncated to ``keep`` tokens (:func:`_concat_plain`'s
    pieces of any stretch of the order)."""
    cuts = even_cuts(order.size, n_chunks(order.size))
    pos = np.zeros(cuts.size, np.int64)  # pos[c]: the stream position where chunk c starts
    np.cumsum(_chunk_sums(lengths, cuts), out=pos[1:])
    pos += start
    none = np.empty(0, np.int64)
    at = np.zeros(cuts.size, np.int64)  # at[c]: the first piece of chunk c
    np.cumsum(_concat_chunks(order, lengths, keep, L, cuts, pos, at, False, none, none.astype(np.int32), none, none,
                             none.astype(np.int32)), out=at[1:])
    out = _piece_arrays(int(at[-1]))
    _concat_chunks(order, lengths, keep, L, cuts, pos, at, True, *out[:5])
    return out


@njit(cache=True, parallel=True)
def _chunk_sums(lengths, cuts):
    out = np.zeros(cuts.size - 1, np.int64)
    for c in prange(cuts.size - 1):
        out[c] = lengths[cuts[c] : cuts[c + 1]].sum()
    return out


@njit(cache=True, parallel=True)
def _concat_chunks(order, lengths, keep, L, cuts, pos, at, write, seq, off, d, ds, n):
    """Pieces per chunk ``cuts[c]:cuts[c+1]`` of the documents (:func:`_concat_pieces`), or with
    ``write`` the pieces written from ``at[c]`` on."""
    out = np.zeros(cuts.size - 1, np.int64)
    for c in prange(cuts.size - 1):
        out[c] = _concat_pieces(order, lengths, cuts[c], cuts[c + 1], pos[c], keep, L, write, at[c], seq, off, d, ds, n)
    return out


@njit(cache=True)
def _concat_pieces(order, lengths, lo, hi, pos, keep, L, write, w, seq, off, d, ds, n) -> int:
    """Count (or, with ``write``, write from piece ``w`` on) the pieces of documents ``order[lo:hi]``
    (``lengths[i]``: the length of document ``order[i]``) of the stream truncated to ``keep``, the
    first starting at stream position ``pos``."""
    first = w
    for i in range(lo, hi):
        if pos >= keep:
            break
        doc = order[i]
        end = min(pos + lengths[i], keep)
        s = pos
        while s < end:
            q = s // L
            top = min(end, (q + 1) * L)
            if write:
                seq[w], off[w], d[w], ds[w], n[w] = q, s - q * L, doc, s - pos, top - s
            w += 1
            s = top
        pos += lengths[i]
    return w - first


def _stream_spans(order: np.ndarray, lengths: np.ndarray, keep: int):
    """Documents joined in order, truncated to the first ``keep`` stream tokens."""
    starts = np.cumsum(lengths) - lengths
    live = starts < keep
    s = starts[live]
    n = np.minimum(s + lengths[live], keep) - s
    return s, n, order[live], np.zeros(s.size, np.int64), np.zeros(s.size, bool)


def _concat(order, lengths, L: int, atom: int | None, rng: np.random.Generator):
    """Packing & shuffling concat: join, cut into atoms, shuffle atoms, merge/split to MSL (A.3, Fig. 6)."""
    total = int(lengths.sum())
    unit = L if atom is None else max(atom, L)
    keep = total // unit * unit
    s, n, d, ds, e = _stream_spans(order, lengths, keep)
    if atom is not None:
        a_id, a_off, d, ds, n, e = _cut(s, n, d, ds, e, atom)
        slot = np.empty(keep // atom, np.int64)
        slot[rng.permutation(slot.size)] = np.arange(slot.size)
        s = slot[a_id] * atom + a_off
    return _cut(s, n, d, ds, e, L), keep // L


def _padding(order, lengths, L: int, atom: int, rng: np.random.Generator | None):
    """Packing & shuffling padding: (A-1)-token pieces + EOS, padded, shuffled, merged/split to MSL (A.3, Fig. 5)."""
    text = lengths - 1
    k = np.maximum(1, -(-text // (atom - 1)))
    rep = np.repeat(np.arange(order.size), k)
    j = np.arange(rep.size) - np.repeat(np.cumsum(k) - k, k)
    last = j == k[rep] - 1
    ds = j * (atom - 1)
    n = np.where(last, lengths[rep] - ds, atom - 1)
    e = ~last
    size = n + e
    slot = np.full(size.size, atom, np.int64) if atom <= L else -(-size // L) * L
    perm = np.arange(size.size) if rng is None else rng.permutation(size.size)
    rep, ds, n, e, slot = rep[perm], ds[perm], n[perm], e[perm], slot[perm]
    starts = np.cumsum(slot) - slot
    total = int(slot.sum())
    return _cut(starts, n + e, order[rep], ds, e, L), -(-total // L)


@njit(cache=True)
def _best_fit_bins(sizes: np.ndarray, cap: int):
    """Best fit for items in the given (decreasing) order: the open bin with the least remaining
    capacity that still fits, found in O(log cap) with a count tree over capacities 0..cap."""
    n = sizes.size
    width = 1
    while width < cap + 1:
        width *= 2
    tree = np.zeros(2 * width, np.int64)
    head = np.full(cap + 1, -1, np.int64)
    nxt = np.empty(n, np.int64)
    fill = np.empty(n, np.int64)
    bin_of = np.empty(n, np.int64)
    offset = np.empty(n, np.int64)
    n_bins = 0
    for i in range(n):
        s = sizes[i]
        node = s + width
        while tree[node] == 0:  # walk right to the next subtree holding a bin
            while node & 1:
                node >>= 1
            if node == 0:
                break
            node += 1
        if node == 0:
            b = n_bins
            n_bins += 1
            fill[b] = 0
        else:
            while node < width:
                node = 2 * node if tree[2 * node] > 0 else 2 * node + 1
            c = node - width
            b = head[c]
            head[c] = nxt[b]
            while node > 0:
                tree[node] -= 1
                node >>= 1
        bin_of[i] = b
        offset[i] = fill[b]
        fill[b] += s
        r = cap - fill[b]
        if r > 0:
            nxt[b] = head[r]
            head[r] = b
            node = r + width
            while node > 0:
                tree[node] += 1
                node >>= 1
    return bin_of, offset, n_bins


def _best_fit(order, lengths, L: int, rng: np.random.Generator):
    """Best-fit decreasing of whole documents; longer ones give full MSL chunks plus a remainder.

    Ties in size keep ``doc_order``. Sequence ids are a seeded permutation so that id order does
    not sort sequences by the size of their largest document.
    """
    full, rem = lengths // L, lengths % L
    rep = np.repeat(np.arange(order.size), full)
    j = np.arange(rep.size) - np.repeat(np.cumsum(full) - full, full)
    items = np.flatnonzero(rem)
    by_size = items[np.argsort(-rem[items], kind="stable")]
    bin_of, offset, n_bins = _best_fit_bins(rem[by_size], L)
    n_seq = rep.size + n_bins
    sid = rng.permutation(n_seq)
    seq = np.concatenate([sid[: rep.size], sid[rep.size + bin_of]])
    start = np.concatenate([np.zeros(rep.size, np.int64), offset])
    doc = order[np.concatenate([rep, by_size])]
    ds = np.concatenate([j * L, full[by_size] * L])
    n = np.concatenate([np.full(rep.size, L, np.int64), rem[by_size]])
    return (seq, start, doc, ds, n, np.zeros(n.size, bool)), n_seq


def _merge(seq, start, doc, ds, n, e):
    """Sort rows by sequence position and merge spans that continue each other in the same
    sequence and document (atoms that happen to land side by side after shuffling). Rows already
    in order with nothing to merge (concat without atoms) are returned as they are."""
    ordered, joins = _order_and_joins(seq, start, doc, ds, n, e)
    if ordered and not joins:
        return seq, start, doc, ds, n, e
    if not ordered:
        o = np.lexsort((start, seq))
        seq, start, doc, ds, n, e = seq[o], start[o], doc[o], ds[o], n[o], e[o]
        del o
    cont = _continues(seq, start, doc, ds, n, e)
    if not cont.any():
        return seq, start, doc, ds, n, e
    head = np.flatnonzero(np.r_[True, ~cont])
    tail = np.r_[head[1:], seq.size] - 1
    return seq[head], start[head], doc[head], ds[head], np.add.reduceat(n, head), e[tail]


@njit(cache=True)
def _order_and_joins(seq, start, doc, ds, n, e) -> tuple[bool, bool]:
    """(rows sorted by (seq, start); some row continues the previous one), in one pass."""
    ordered, joins = True, False
    for i in range(1, seq.size):
        if seq[i] < seq[i - 1] or (seq[i] == seq[i - 1] and start[i] < start[i - 1]):
            ordered = False
        elif (seq[i] == seq[i - 1] and doc[i] == doc[i - 1] and not e[i - 1] and start[i - 1] + n[i - 1] == start[i]
              and ds[i - 1] + n[i - 1] == ds[i]):
            joins = True
    return ordered, joins


@njit(cache=True)
def _continues(seq, start, doc, ds, n, e) -> np.ndarray:
    """``out[i]``: sorted row i+1 continues row i (same sequence and document, adjacent spans)."""
    out = np.zeros(max(seq.size - 1, 0), np.bool_)
    for i in range(1, seq.size):
        out[i - 1] = (seq[i] == seq[i - 1] and doc[i] == doc[i - 1] and not e[i - 1] and start[i - 1] + n[i - 1] == start[i]
                      and ds[i - 1] + n[i - 1] == ds[i])
    return out


def _segments(seq, start, doc, ds, n, e) -> pl.DataFrame:
    """The segments frame; polars takes the int64 / int32 arrays without a copy."""
    return pl.DataFrame(
        {
            "sequence_id": seq,
            "seq_token_start": start.astype(np.int32, copy=False),
            "doc_id": doc,
            "doc_token_start": ds,
            "n_tokens": n.astype(np.int32, copy=False),
            "eos_added": e,
        },
        schema=PACKED_SEGMENT_SCHEMA,
    )


def _eos_added(segments: pl.DataFrame) -> np.ndarray:
    if "eos_added" in segments.columns:
        return segments["eos_added"].to_numpy().astype(bool)
    return np.zeros(segments.height, bool)


STREAM_DOCS = 1 << 20  # documents whose pieces a streamed packing (pack_concat_file) cuts and writes at once


@dataclass(frozen=True)
class SegmentCounts:
    """What :func:`packing_stats` counts in the segments: rows, (sequence, document) pairs, the
    documents holding a segment and those holding two or more (cut)."""

    segments: int
    pairs: int
    docs_packed: int
    docs_cut: int

    @staticmethod
    def of(seq: np.ndarray, doc: np.ndarray, dense: bool = True) -> "SegmentCounts":
        """The counts of these rows; ``dense`` False counts the documents by sorting, not in an
        array as long as the largest id (a stretch of a larger packing)."""
        if dense:
            per_doc = np.bincount(doc) if doc.size else np.zeros(0, np.int64)
        else:
            per_doc = np.unique(doc, return_counts=True)[1]
        return SegmentCounts(int(doc.size), distinct_pairs(seq, doc), int((per_doc > 0).sum()), int((per_doc > 1).sum()))

    def __add__(self, other: "SegmentCounts") -> "SegmentCounts":
        return SegmentCounts(*(a + b for a, b in zip(vars(self).values(), vars(other).values())))


def pack_concat_file(doc_order: np.ndarray, stream_lengths: np.ndarray, seq_len: int, path) -> tuple[Packing, dict]:
    """``concat`` without atoms written to the segments Parquet file ``path`` (atomically) a stretch
    of ``STREAM_DOCS`` documents of the order at a time: the rows :func:`pack` gives, and its
    :func:`packing_stats`. It holds ``doc_order`` and ``stream_lengths`` (16 bytes a document) and one
    stretch's pieces, never the whole segments table: each stretch starts where the ones before end
    (their tokens summed), and a document lies in one stretch, so its counts add up. Lengths given
    as int32 (:func:`narrow_lengths`) are read as they are. The Packing returned has no segments
    (``segments`` None: they are in the file)."""
    check_seq_len(seq_len)
    L = int(seq_len)
    order, all_lengths, tokens_in = _check_docs(doc_order, stream_lengths, narrow=True)
    keep, pos, writer = tokens_in // L * L, 0, None
    counts = SegmentCounts(0, 0, 0, 0)
    with atomic_path(Path(path)) as tmp:
        try:
            for a in range(0, max(order.size, 1), STREAM_DOCS):
                ids = order[a : a + STREAM_DOCS]
                lengths = all_lengths[ids]
                seq, off, d, ds, n, e = _concat_span(ids, lengths, L, keep, pos) if pos < keep else _piece_arrays(0)
                pos += int(lengths.sum())
                table = _segments(seq, off, d, ds, n, e).to_arrow()
                writer = writer or pq.ParquetWriter(tmp, table.schema, compression="zstd", write_statistics=False)
                writer.write_table(table)
                counts += SegmentCounts.of(seq, d, dense=False)
        finally:
            if writer is not None:
                writer.close()
    packed = Packing(None, keep // L, L, tokens_in, keep, tokens_in - keep)
    return packed, packing_stats(packed, counts)


def packing_stats(p: Packing, counts: SegmentCounts | None = None) -> dict[str, float | int | str]:
    """Per-variant report: tokens kept, padding fraction, documents cut, sequences.

    A document is *cut* when its tokens lie in two or more segments, i.e. its context is broken
    (across sequences, or across pieces). ``docs_per_sequence`` is the mean number of distinct
    documents per sequence (Don't Shuffle, Optimize's within-sequence diversity). ``counts``: the
    segments' counts, for a packing whose segments are in their file (:func:`pack_concat_file`).
    """
    if counts is None:
        counts = SegmentCounts.of(p.segments["sequence_id"].to_numpy(), p.segments["doc_id"].to_numpy())
    pairs = counts.pairs
    kept = p.tokens_in - p.tokens_dropped
    return {
        "packing": packing_name(p.variant, None if p.atom is None else p.atom / p.seq_len),
        "variant": p.variant,
        "atom": p.atom or 0,
        "seq_len": p.seq_len,
        "sequences": p.n_sequences,
        "segments": counts.segments,
        "tokens_in": p.tokens_in,
        "tokens_kept": kept,
        "tokens_dropped": p.tokens_dropped,
        "tokens_eos_added": p.tokens_eos_added,
        "tokens_padding": p.tokens_padding,
        "padding_fraction": p.tokens_padding / p.tokens_packed if p.tokens_packed else 0.0,
        "efficiency": kept / p.tokens_packed if p.tokens_packed else 0.0,
        "docs_packed": counts.docs_packed,
        "docs_cut": counts.docs_cut,
        "docs_per_sequence": pairs / p.n_sequences if p.n_sequences else 0.0,
    }


def distinct_pairs(seq: np.ndarray, doc: np.ndarray) -> int:
    """Number of distinct (sequence, document) pairs: one pass over rows grouped by sequence (a
    packing's order), else a sort of the pairs."""
    seq, doc = np.asarray(seq, np.int64), np.asarray(doc, np.int64)
    if seq.size == 0:
        return 0
    if grouped(seq) and seq[0] >= 0:
        return int(docs_per_sequence(seq, doc, int(seq[-1]) + 1).sum())
    return int(np.unique(np.stack([seq, doc], axis=1), axis=0).shape[0])


def conservation(segments: pl.DataFrame, stream_lengths: np.ndarray, seq_len: int, gaps: bool = False) -> dict[str, int | bool]:
    """Check a segments table against the token store; ``ok`` when nothing is lost or doubled.

    Every document's spans must tile a prefix ``[0, kept)`` of its stream without overlap (with
    ``gaps``, as a packing around a frozen prefix drops tails that may lie mid-document: lie in
    ``[0, length)`` without overlap; every token not in a span is counted dropped), and in
    every sequence the spans (each plus its inserted EOS) must lie inside ``[0, seq_len)`` without
    overlap. Works for every variant and for 5-column tables from older code. Memory: the rows
    are visited in document order through one index array (a counting sort by document), never
    copied sorted.
    """
    lengths = np.asarray(stream_lengths, dtype=np.int64)
    d = segments["doc_id"].to_numpy().astype(np.int64, copy=False)
    ds = segments["doc_token_start"].to_numpy().astype(np.int64, copy=False)
    n = segments["n_tokens"].to_numpy()
    known = bool(d.size == 0 or (d.min() >= 0 and d.max() < lengths.size))
    per_doc = np.zeros(lengths.size, np.int64)
    tiles = known and bool(_doc_tiles(_by_doc(d, ds, lengths.size), d, ds, n, lengths, gaps, per_doc))
    sid = segments["sequence_id"].to_numpy()
    st = segments["seq_token_start"].to_numpy()
    eos = _eos_added(segments)
    by_seq = np.arange(0) if _rows_ordered(sid, st) else np.lexsort((st, sid))
    fits = bool(_seq_fits(by_seq, sid, st, n, eos, seq_len))
    kept = int(per_doc.sum())
    return {
        "ok": tiles and fits and bool((per_doc <= lengths).all()),
        "tokens_in": int(lengths.sum()),
        "tokens_kept": kept,
        "tokens_dropped": int(lengths.sum()) - kept,
        "docs_partial": int(((per_doc > 0) & (per_doc < lengths)).sum()),
    }


IN_ORDER, BROKEN, UNORDERED = 0, 1, 2  # what _stream_rows finds in a batch


def conservation_file(path, stream_lengths: np.ndarray, seq_len: int, gaps: bool = False) -> dict[str, int | bool]:
    """:func:`conservation` of a segments Parquet file, read a batch of rows at a time while its
    rows come in sequence order and each document's spans in document order (every ``concat``
    packing's): per document its tokens so far, which is where its next span must start, and the
    previous row's sequence and end. Memory: 8 bytes a document beside ``stream_lengths``, and one
    batch. A file in another order (``best_fit``, atom shuffles) or with ``gaps`` is checked whole
    by :func:`conservation`, which is exact in every case; on a file in that order both agree."""
    lengths = np.asarray(stream_lengths)  # int32 (narrow_lengths) or int64, read as they are
    if gaps:
        return conservation(pl.read_parquet(path), lengths, seq_len, gaps=True)
    per_doc = np.zeros(lengths.size, np.int64)
    last = np.array([-1, 0, 0], np.int64)  # the previous row's sequence, start and end (with its EOS)
    ok = True
    file = pq.ParquetFile(path, pre_buffer=False)  # pre-buffering reads ahead in proportion to the file
    has_eos = "eos_added" in file.schema_arrow.names
    columns = ["sequence_id", "seq_token_start", "doc_id", "doc_token_start", "n_tokens", *(["eos_added"] if has_eos else [])]
    for batch in file.iter_batches(batch_size=1 << 20, columns=columns):
        a = [batch.column(i).to_numpy(zero_copy_only=False) for i in range(len(columns))]
        eos = a[5].astype(np.bool_) if has_eos else np.zeros(batch.num_rows, np.bool_)
        found = _stream_rows(a[0].astype(np.int64), a[1].astype(np.int64), a[2].astype(np.int64), a[3].astype(np.int64),
                             a[4].astype(np.int64), eos, lengths, per_doc, int(seq_len), last)
        if found == UNORDERED:
            return conservation(pl.read_parquet(path), lengths, seq_len)
        ok = ok and found == IN_ORDER
    within, kept, partial = _tally(per_doc, lengths)
    total = int(lengths.sum())
    return {"ok": ok and within, "tokens_in": total, "tokens_kept": int(kept), "tokens_dropped": total - int(kept),
            "docs_partial": int(partial)}


@njit(cache=True)
def _tally(per_doc, lengths) -> tuple[bool, int, int]:
    """(every document's tokens placed within its length, the tokens placed, the documents placed in
    part), in one pass: no per-document temporaries."""
    within, kept, partial = True, 0, 0
    for i in range(per_doc.size):
        within = within and per_doc[i] <= lengths[i]
        kept += per_doc[i]
        partial += 0 < per_doc[i] < lengths[i]
    return within, kept, partial


@njit(cache=True)
def _stream_rows(sid, st, d, ds, n, eos, lengths, per_doc, seq_len, last) -> int:
    """One batch of :func:`conservation_file`: UNORDERED at the first row out of sequence order or
    not where its document's tokens so far end (a document's spans out of order, or a gap or
    overlap: the whole check decides); else BROKEN when a row names an unknown document, holds no
    token, ends past its document or its sequence, or overlaps the previous row; else IN_ORDER."""
    out = IN_ORDER
    for i in range(sid.size):
        if sid[i] < last[0] or (sid[i] == last[0] and st[i] < last[1]):
            return UNORDERED
        if d[i] < 0 or d[i] >= lengths.size:
            out = BROKEN
            continue
        if ds[i] != per_doc[d[i]]:
            return UNORDERED
        ext = n[i] + eos[i]
        if n[i] <= 0 or ds[i] + n[i] > lengths[d[i]] or st[i] + ext > seq_len or st[i] < (last[2] if sid[i] == last[0] else 0):
            out = BROKEN
        per_doc[d[i]] += n[i]
        last[0], last[1], last[2] = sid[i], st[i], st[i] + ext
    return out


@njit(cache=True)
def _by_doc(d, ds, n_docs):
    """Row indices sorted by (doc, doc start): a counting sort by document, then an insertion sort
    of each document's few rows (already in order for every packing variant)."""
    ptr = np.zeros(n_docs + 1, np.int64)
    for x in d:
        ptr[x + 1] += 1
    for g in range(n_docs):
        ptr[g + 1] += ptr[g]
    fill = ptr[:-1].copy()
    perm = np.empty(d.size, np.int64)
    for i in range(d.size):
        perm[fill[d[i]]] = i
        fill[d[i]] += 1
    for g in range(n_docs):
        for a in range(ptr[g] + 1, ptr[g + 1]):
            x, b = perm[a], a - 1
            while b >= ptr[g] and ds[perm[b]] > ds[x]:
                perm[b + 1] = perm[b]
                b -= 1
            perm[b + 1] = x
    return perm


@njit(cache=True)
def _doc_tiles(perm, d, ds, n, lengths, gaps, per_doc) -> bool:
    """Each document's rows (in ``perm`` order) start at 0 and continue each other (with ``gaps``:
    start at or after the previous end), hold tokens and end inside the document; fills ``per_doc``."""
    ok = True
    for a in range(perm.size):
        i = perm[a]
        new_doc = a == 0 or d[perm[a - 1]] != d[i]
        prev_end = 0 if new_doc else ds[perm[a - 1]] + n[perm[a - 1]]
        if gaps:
            ok = ok and ds[i] >= 0 and ds[i] >= prev_end
        else:
            ok = ok and ds[i] == prev_end
        ok = ok and n[i] > 0 and ds[i] + n[i] <= lengths[d[i]]
        per_doc[d[i]] += n[i]
    return ok


@njit(cache=True)
def _rows_ordered(sid, st) -> bool:
    for i in range(1, sid.size):
        if sid[i] < sid[i - 1] or (sid[i] == sid[i - 1] and st[i] < st[i - 1]):
            return False
    return True


@njit(cache=True)
def _seq_fits(perm, sid, st, n, eos, seq_len) -> bool:
    """Every row (in ``perm`` order, or row order when ``perm`` is empty) lies in ``[0, seq_len)``
    at or after the end of the previous row of its sequence (the row plus its inserted EOS)."""
    ok = True
    m = perm.size if perm.size else sid.size
    for a in range(m):
        i = perm[a] if perm.size else a
        ext = np.int64(n[i]) + np.int64(eos[i])
        ok = ok and st[i] + ext <= seq_len
        if a == 0 or sid[perm[a - 1] if perm.size else a - 1] != sid[i]:
            ok = ok and st[i] >= 0
        else:
            j = perm[a - 1] if perm.size else a - 1
            ok = ok and st[i] >= np.int64(st[j]) + np.int64(n[j]) + np.int64(eos[j])
    return ok


class SequenceStore:
    """Random access to packed sequences by id: ``rows`` (tokens only, each segment copied as one
    span of the store) and ``masked_batch`` (token by token, with segments and the padding mask).

    ``tokens`` is the flat token store (every document followed by EOS; may be a memmap) and
    ``doc_offsets[d]`` the start of document d in it. Only the requested tokens are read. An
    inserted EOS (``eos_added``) is the document's own final store token; positions covered by
    nothing hold ``pad_id``.
    """

    def __init__(self, tokens: np.ndarray, doc_offsets: np.ndarray, segments: pl.DataFrame, seq_len: int, *, pad_id: int = 0):
        seg = segments.sort(["sequence_id", "seq_token_start"])
        offsets = np.asarray(doc_offsets, dtype=np.int64)
        doc = seg["doc_id"].to_numpy()
        self.tokens, self.seq_len, self.pad_id = tokens, seq_len, pad_id
        self.sid = seg["sequence_id"].to_numpy()
        self.start = seg["seq_token_start"].to_numpy().astype(np.int64)
        self.n = seg["n_tokens"].to_numpy().astype(np.int64)
        self.eos = _eos_added(seg)
        self.src = offsets[doc] + seg["doc_token_start"].to_numpy()
        self.eos_src = offsets[doc + 1] - 1
        self._file, self.src_file, self.src_local = _in_files(tokens, self.src, self.n)
        _, self.eos_file, self.eos_local = _in_files(tokens, self.eos_src, np.ones_like(self.eos_src))
        self.n_sequences = int(self.sid.max()) + 1 if self.sid.size else 0
        self.ptr = np.searchsorted(self.sid, np.arange(self.n_sequences + 1))
        fill = np.bincount(self.sid, weights=self.n + self.eos, minlength=self.n_sequences)
        self.has_padding = bool((fill < seq_len).any())

    def masked_batch(self, sequence_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(tokens (B, L) int64, segment_row (S,), segment_start (S,), filled (B, L) bool)``.

        ``filled`` is false exactly at padding positions (exclude them from the loss, and as
        attention keys when attention may cross segments).
        """
        ids = np.asarray(sequence_ids, dtype=np.int64)
        L = self.seq_len
        sel, rows = self._select(ids)
        n, src, starts = self.n[sel], self.src[sel], self.start[sel]
        dst = rows * L + starts
        shift = np.repeat(np.cumsum(n) - n, n)
        idx = np.arange(int(n.sum()))
        out = np.full(ids.size * L, self.pad_id, dtype=np.int64)
        filled = np.zeros(ids.size * L, dtype=bool)
        at = np.repeat(dst, n) + idx - shift
        out[at] = np.asarray(self.tokens[np.repeat(src, n) + idx - shift])
        filled[at] = True
        e = self.eos[sel]
        if e.any():
            out[dst[e] + n[e]] = np.asarray(self.tokens[self.eos_src[sel][e]])
            filled[dst[e] + n[e]] = True
        return out.reshape(ids.size, L), rows, starts, filled.reshape(ids.size, L)

    def batch(self, sequence_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return ``(tokens (B, L) int64, segment_row (S,), segment_start (S,))`` for the batch."""
        return self.masked_batch(sequence_ids)[:3]

    def rows(self, sequence_ids: np.ndarray, block: int = 1024) -> np.ndarray:
        """The ``(B, L)`` tokens of ``sequence_ids`` in the token store's dtype, the same as
        ``batch(...)[0]``: each segment copied as one span of its token file, up to ``block``
        sequences a task, the tasks on a thread a core (the copy releases the GIL)."""
        ids = np.asarray(sequence_ids, dtype=np.int64)
        out = np.empty((ids.size, self.seq_len), np.dtype(self.tokens.dtype))
        step = task_size(ids.size, block)
        parallel_map(lambda a: self._fill(ids[a : a + step], out[a : a + step].reshape(-1)), list(range(0, ids.size, step)))
        return out

    def _select(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(segment rows of the sequences ids, in order; the index in ids of each)``."""
        lo, hi = self.ptr[ids], self.ptr[ids + 1]
        counts = hi - lo
        sel = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        return sel, np.repeat(np.arange(ids.size), counts)

    def _fill(self, ids: np.ndarray, out: np.ndarray) -> None:
        """Write the tokens of ``ids`` into the flat ``out`` (``ids.size * seq_len``)."""
        sel, rows = self._select(ids)
        n = self.n[sel]
        dst = rows * self.seq_len + self.start[sel]
        out[:] = self.pad_id
        f = self.src_file[sel]
        for u in np.unique(f):
            m = f == u
            _copy_spans(out, self._file(int(u)), self.src_local[sel][m], dst[m], n[m])
        e = self.eos[sel]
        if e.any():
            ef, el, at = self.eos_file[sel][e], self.eos_local[sel][e], dst[e] + n[e]
            for u in np.unique(ef):
                m = ef == u
                out[at[m]] = self._file(int(u))[el[m]]


def _in_files(tokens, starts: np.ndarray, lengths: np.ndarray) -> tuple:
    """``(file u -> its flat ids, file of each span, the span's start in its file)`` for the spans
    ``starts .. starts + lengths`` of the token store (a flat array, or a ``ShardedTokens``
    whose runs hold whole documents, so a span lies in one file)."""
    starts = np.asarray(starts, dtype=np.int64)
    if not hasattr(tokens, "locate"):
        flat = np.asarray(tokens).view(np.ndarray)
        return (lambda u: flat), np.zeros(starts.size, np.int64), starts
    run, file, local = tokens.locate(starts)
    last = tokens.locate(starts + np.maximum(np.asarray(lengths, np.int64), 1) - 1)[0]
    if (last != run).any():
        raise StrataInputError("a document's tokens span two runs of the token store index", fix="rematerialize tokens")
    return (lambda u: tokens.file_ids(u).view(np.ndarray)), file, local


@njit(nogil=True, cache=True)
def _copy_spans(out: np.ndarray, src: np.ndarray, src_at: np.ndarray, dst_at: np.ndarray, n: np.ndarray) -> None:
    """``out[dst_at[i] : + n[i]] = src[src_at[i] : + n[i]]`` for every span i."""
    for i in range(n.size):
        s, d = src_at[i], dst_at[i]
        for j in range(n[i]):
            out[d + j] = src[s + j]


def sequence_tokens(
    tokens: np.ndarray, doc_offsets: np.ndarray, segments: pl.DataFrame, seq_len: int, sequence_ids: np.ndarray
) -> np.ndarray:
    """The (len(sequence_ids), seq_len) token matrix of the given sequences."""
    return SequenceStore(tokens, doc_offsets, segments, seq_len).batch(sequence_ids)[0]
