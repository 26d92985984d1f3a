"""Characteristic vectors of packed sequences (Don't Shuffle, Optimize, "A Greedy Algorithm"; TerRIFIC curricula eq. for J_sched).

For sequence s, ``c_{s,j}`` counts its tokens from cluster j and ``l_{s,b}`` its tokens from
documents whose length falls in quantile bin b; ``l_s`` = sum_j c_{s,j} is the sequence length
(variable lengths allowed, as TerRIFIC curricula writes it). Both matrices are stored sparse (CSR): a
sequence holds a handful of documents, so only a few entries per row are nonzero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping

import numpy as np
from numba import njit, prange

from pipeline.errors import StrataInputError
from pipeline.segments import as_integers, even_cuts, grouped, insert_sorted, n_chunks
from pipeline.threads import concurrently

COUNTED_MAX = 1 << 22  # lengths up to this are counted (a table of that many entries), not sorted or searched one by one


def length_bin_edges(
    doc_lengths: np.ndarray, length_bins: int, length_bin_weighting: Literal["tokens", "documents"] = "tokens"
) -> np.ndarray:
    """Interior cut points of ``length_bins`` quantile bins over document lengths.

    Don't Shuffle, Optimize asks for "a quantile histogram over document lengths" without saying quantiles of
    what. The default, ``length_bin_weighting="tokens"``, puts the cuts at token-weighted quantiles: each bin
    then holds about 1/B of all *tokens*, so every kappa_b (the bin's global token share) is
    about 1/B and every term of f3's length sum, and every bin of the deviation metrics, weighs
    the same. Document quantiles (``"documents"``) would spend most bins on the many short
    documents that hold few tokens (the demo corpus: 82% of documents, a small share of tokens).

    Returns sorted, unique edges ``e`` (at most ``length_bins - 1``); bin ``b`` holds lengths in
    ``(e[b-1], e[b]]`` (see :func:`length_bin_of`). Ties among lengths can merge bins, so the
    number of bins is ``len(e) + 1 <= length_bins``; no bin is empty of documents.
    """
    lengths = as_integers(doc_lengths)  # int32 lengths are not copied to int64 (10M documents: 80 MB)
    if lengths.ndim != 1 or lengths.size == 0:
        raise StrataInputError("document lengths must be a non-empty 1-D array", fix="pass one length per doc_id")
    if lengths.min() <= 0:
        raise StrataInputError("a document length is <= 0", fix="pass stream lengths (n_tokens + 1), all positive")
    if not isinstance(length_bins, (int, np.integer)) or length_bins < 1:
        raise StrataInputError(f"number of length bins B={length_bins!r} is impossible", fix="set B to an integer >= 1")
    if length_bin_weighting not in ("tokens", "documents"):
        raise StrataInputError(f"unknown length_bin_weighting {length_bin_weighting!r}", fix="use 'tokens' or 'documents'")
    if lengths.max() <= COUNTED_MAX:  # the distinct lengths and their counts: O(N), no sort of N lengths
        return counted_length_bin_edges(np.bincount(lengths), length_bins, length_bin_weighting)
    srt = np.sort(lengths.astype(np.int64))
    return _quantile_edges(srt, np.cumsum(srt if length_bin_weighting == "tokens" else np.ones_like(srt)), length_bins)


def counted_length_bin_edges(
    count: np.ndarray, length_bins: int, length_bin_weighting: Literal["tokens", "documents"] = "tokens"
) -> np.ndarray:
    """:func:`length_bin_edges` of the documents whose lengths' counts are ``count`` (``count[x]``:
    documents of stream length x, a ``bincount``): the same edges, for a corpus whose lengths are
    counted stretch by stretch and never held (``pipeline.ordering.segment_files``)."""
    count = np.asarray(count, dtype=np.int64)
    srt = np.flatnonzero(count)
    if srt.size == 0 or srt[0] <= 0:
        raise StrataInputError("document lengths must be counted and positive", fix="count stream lengths (n_tokens + 1), all positive")
    count = count[srt]
    return _quantile_edges(srt, np.cumsum(srt * count if length_bin_weighting == "tokens" else count), length_bins)


def _quantile_edges(srt: np.ndarray, mass: np.ndarray, length_bins: int) -> np.ndarray:
    q = np.arange(1, length_bins, dtype=np.float64) / length_bins * mass[-1]
    # smallest length x such that documents of length <= x hold at least q of the mass (the same x
    # from the mass summed per distinct length as from the mass document by document)
    edges = np.unique(srt[np.searchsorted(mass, q, side="left")])
    return edges[edges < srt[-1]]


def length_bin_of(doc_lengths: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin id (int64, 0..len(edges)) of each document length: bin b holds ``(edges[b-1], edges[b]]``.
    Many lengths read their bin from a table of every length up to the longest (a gather instead of
    a binary search each)."""
    edges, lengths = np.asarray(edges), as_integers(doc_lengths)
    if lengths.size > 1024:
        lo, hi = int(lengths.min()), int(lengths.max())
        if 0 <= lo and hi <= min(COUNTED_MAX, lengths.size):
            return np.searchsorted(edges, np.arange(hi + 1), side="left").astype(np.int64)[lengths]
    return np.searchsorted(edges, lengths, side="left").astype(np.int64)


@dataclass(frozen=True)
class Csr:
    """Row-compressed nonnegative integer matrix (rows = sequences)."""

    indptr: np.ndarray  # (M+1,) int64
    indices: np.ndarray  # (nnz,) int64 column ids, sorted within a row
    data: np.ndarray  # (nnz,) float64 token counts (integer valued)
    n_cols: int

    @property
    def n_rows(self) -> int:
        return self.indptr.size - 1

    def column_totals(self) -> np.ndarray:
        return np.bincount(self.indices, weights=self.data, minlength=self.n_cols)

    def take_rows(self, rows: np.ndarray) -> "Csr":
        """The submatrix of the given rows, in the given order (vectorized gather)."""
        rows = np.asarray(rows, dtype=np.int64)
        counts = self.indptr[rows + 1] - self.indptr[rows]
        indptr = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        src = np.repeat(self.indptr[rows] - indptr[:-1], counts) + np.arange(indptr[-1])
        return Csr(indptr, self.indices[src], self.data[src], self.n_cols)


@dataclass(frozen=True)
class SequenceFeatures:
    """What the sequence-level schedulers see: c_s, l_{s,b}, l_s and the ids they stand for."""

    sequence_ids: np.ndarray  # (M,) int64, ascending: row m describes sequence_ids[m]
    clusters: Csr  # c_{s,j}
    bins: Csr  # l_{s,b}
    lengths: np.ndarray  # (M,) float64, l_s
    bin_edges: np.ndarray  # interior quantile edges over document lengths (len = B_eff - 1)
    cluster_bin_tokens: np.ndarray  # (K, B_eff) tokens per (cluster, bin): kappa_{b|j} of TerRIFIC curricula
    spans: np.ndarray | None = None  # (M,) document spans per sequence (None: one each)
    columns: Mapping[str, Csr] = field(default_factory=dict)  # tokens per category of other document columns

    @property
    def n_sequences(self) -> int:
        return self.sequence_ids.size

    def take_rows(self, rows: np.ndarray) -> "SequenceFeatures":
        """The features of these rows (in this order); bin edges and the joint table stay global."""
        rows = np.asarray(rows, dtype=np.int64)
        spans = None if self.spans is None else self.spans[rows]
        cols = {k: v.take_rows(rows) for k, v in self.columns.items()}
        return SequenceFeatures(self.sequence_ids[rows], self.clusters.take_rows(rows), self.bins.take_rows(rows),
                                self.lengths[rows], self.bin_edges, self.cluster_bin_tokens, spans, cols)


@dataclass(frozen=True)
class SequenceIds:
    """A packing's sequence ids, ascending, without their features: what an order that reads only
    the number of sequences takes (``random``, ``original``; ``StrategySpec.features``)."""

    sequence_ids: np.ndarray  # (M,) int64, ascending

    @property
    def n_sequences(self) -> int:
        return self.sequence_ids.size

    @classmethod
    def of_segments(cls, seg_sequence: np.ndarray) -> "SequenceIds":
        """The distinct ids of the segments' sequences (one pass when grouped by ascending id)."""
        seq = np.asarray(seg_sequence).astype(np.int64, copy=False)
        if seq.size and grouped(seq):
            return cls(seq[np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]])])
        return cls(np.unique(seq))


def _csr_from_pairs(rows: np.ndarray, cols: np.ndarray, weights: np.ndarray, n_rows: int, n_cols: int) -> Csr:
    """Sum ``weights`` per (row, column) pair. Rows grouped in ascending order (a packing's
    segments) are summed group by group (numba, no sort of the pairs); otherwise the pairs are sorted."""
    if grouped(rows):  # every row 0..n_rows-1 holds pairs (dense sequence rows)
        starts = np.append(np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]), rows.size)
        return _grouped_csr(starts, np.arange(rows.size), weights, np.asarray(cols, np.int64), n_cols)
    key = rows * np.int64(n_cols) + cols
    uniq, inverse = np.unique(key, return_inverse=True)
    data = np.bincount(inverse, weights=weights, minlength=uniq.size).astype(np.float64)
    r = uniq // n_cols
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=n_rows), out=indptr[1:])
    return Csr(indptr, (uniq % n_cols).astype(np.int64), data, int(n_cols))


def _first_of_each(values: np.ndarray) -> np.ndarray:
    """A mask keeping one row per distinct (non-negative) value."""
    seen = np.zeros(int(values.max()) + 1, dtype=np.bool_)
    return _first_mask(values, seen)


@njit(cache=True)
def _first_mask(values, seen):
    out = np.zeros(values.size, np.bool_)
    for i in range(values.size):
        if not seen[values[i]]:
            seen[values[i]] = True
            out[i] = True
    return out


def _dense_rows(seg_sequence: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(seg_sequence, return_inverse=True)``, in one pass when ids ascend."""
    if grouped(seg_sequence):
        change = np.empty(seg_sequence.size, np.bool_)
        change[:1] = True
        np.not_equal(seg_sequence[1:], seg_sequence[:-1], out=change[1:])
        rows = np.cumsum(change) - 1
        return seg_sequence[change], rows
    return np.unique(seg_sequence, return_inverse=True)


def sequence_features(
    seg_sequence: np.ndarray,
    seg_cluster: np.ndarray,
    seg_doc_length: np.ndarray,
    seg_tokens: np.ndarray,
    length_bins: int,
    seg_doc: np.ndarray | None = None,
    bin_edges: np.ndarray | None = None,
    seg_columns: Mapping[str, np.ndarray] | None = None,
    length_bin_weighting: Literal["tokens", "documents"] = "tokens",
) -> SequenceFeatures:
    """Build c_s and l_{s,b} from one row per document span placed in a sequence (vectorized).

    ``seg_doc_length`` is the length of the span's whole document (its stream length), used for
    the length bins; ``seg_tokens`` is the number of the span's tokens in the sequence. Bin edges
    are token-weighted quantiles (``pipeline.reports.diagnostics.length_bin_edges``, shared with the
    metrics so the scheduler balances the very bins the diagnostics measure) over distinct
    documents when ``seg_doc`` is given, else over spans. Given ``bin_edges`` are used as they are
    (e.g. edges of a whole corpus whose sequences are built part by part). ``seg_columns`` maps a
    documents column (e.g. ``source``) to each span's integer category; each becomes a token
    family (tokens per category) the greedy can balance. ``length_bin_weighting`` picks the quantiles of the
    bins (:func:`length_bin_edges`: ``tokens``, the default, or ``documents``).
    """
    seg_sequence = np.asarray(seg_sequence, dtype=np.int64)
    seg_cluster = np.asarray(seg_cluster, dtype=np.int64)
    seg_tokens = np.asarray(seg_tokens, dtype=np.float64)
    seg_doc_length = np.asarray(seg_doc_length, dtype=np.float64)
    if seg_sequence.size == 0:
        raise StrataInputError("there are no sequences to order", fix="pack at least one full sequence first")
    if seg_cluster.min() < 0:
        raise StrataInputError("a cluster id is negative", fix="use cluster ids 0..K-1")
    if seg_tokens.min() <= 0:
        raise StrataInputError("a segment has no tokens", fix="drop empty spans (n_tokens must be > 0)")
    if bin_edges is not None:
        edges = np.asarray(bin_edges, dtype=np.int64)
    elif seg_doc is not None:  # one length per distinct document (the edges do not depend on their order)
        edges = length_bin_edges(seg_doc_length[_first_of_each(np.asarray(seg_doc, dtype=np.int64))], length_bins, length_bin_weighting)
    else:
        edges = length_bin_edges(seg_doc_length, length_bins, length_bin_weighting)
    seq_ids, rows = _dense_rows(seg_sequence)
    m = seq_ids.size
    k = int(seg_cluster.max()) + 1
    bin_of = length_bin_of(seg_doc_length, edges)
    clusters = _csr_from_pairs(rows, seg_cluster, seg_tokens, m, k)
    bins = _csr_from_pairs(rows, bin_of, seg_tokens, m, edges.size + 1)
    lengths = np.bincount(rows, weights=seg_tokens, minlength=m)
    nb = edges.size + 1
    joint = np.bincount(seg_cluster * nb + bin_of, weights=seg_tokens, minlength=k * nb).reshape(k, nb)
    spans = np.bincount(rows, minlength=m).astype(np.int64)
    cols = {}
    for name, codes in (seg_columns or {}).items():
        codes = np.asarray(codes, dtype=np.int64)
        if codes.shape != seg_sequence.shape or (codes.size and codes.min() < 0):
            raise StrataInputError(f"column {name!r} needs one category id >= 0 per span", fix="encode it densely (0..n-1)")
        cols[name] = _csr_from_pairs(rows, codes, seg_tokens, m, int(codes.max()) + 1)
    return SequenceFeatures(seq_ids, clusters, bins, lengths, edges, joint, spans, cols)


def packed_sequence_features(
    seg_sequence: np.ndarray,
    seg_doc: np.ndarray,
    seg_tokens: np.ndarray,
    doc_cluster: np.ndarray,
    doc_length: np.ndarray,
    length_bins: int,
    doc_columns: Mapping[str, np.ndarray] | None = None,
    length_bin_weighting: Literal["tokens", "documents"] = "tokens",
    bin_edges: np.ndarray | None = None,
) -> SequenceFeatures:
    """:func:`sequence_features` of a packing's segments, the documents' cluster, stream length and
    column codes given per document (indexed by doc_id): the same result, built group by group
    from segments grouped by ascending sequence id (a packing's order) without per-segment copies
    of the documents' values (at 10M documents, about 1 GB less). Segments in any other order go
    through :func:`sequence_features`. ``bin_edges``: the length bins' edges as they are (a
    stretch of a packing binned as the whole packing is), else the quantiles of these segments'
    documents."""
    seq = np.asarray(seg_sequence).astype(np.int64, copy=False)
    doc = np.asarray(seg_doc).astype(np.int64, copy=False)
    tokens = np.asarray(seg_tokens)
    doc_columns = doc_columns or {}
    if seq.size == 0 or not grouped(seq):
        return sequence_features(seq, np.asarray(doc_cluster)[doc], np.asarray(doc_length)[doc], tokens, length_bins, doc, bin_edges,
                                 seg_columns={k: np.asarray(v)[doc] for k, v in doc_columns.items()},
                                 length_bin_weighting=length_bin_weighting)
    if tokens.min() <= 0:
        raise StrataInputError("a segment has no tokens", fix="drop empty spans (n_tokens must be > 0)")
    doc_cluster = np.asarray(doc_cluster).astype(np.int64, copy=False)

    def binned() -> tuple[np.ndarray, np.ndarray]:  # one pass on one core: beside the clusters' matrix
        if bin_edges is not None:
            edges = np.asarray(bin_edges, dtype=np.int64)
        else:  # one length per distinct document (the edges do not depend on their order)
            edges = length_bin_edges(np.asarray(doc_length)[doc[_first_of_each(doc)]], length_bins, length_bin_weighting)
        return edges, length_bin_of(doc_length, edges).astype(np.int32)

    def by_cluster() -> tuple[np.ndarray, Csr]:
        starts = np.append(np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]]), seq.size)
        lo_c, hi_c = _lookup_range(doc, doc_cluster)
        if lo_c < 0:
            raise StrataInputError("a cluster id is negative", fix="use cluster ids 0..K-1")
        return starts, _grouped_csr(starts, doc, tokens, doc_cluster, hi_c + 1)

    (edges, doc_bin), (starts, clusters) = concurrently(binned, by_cluster)
    nb, k = edges.size + 1, clusters.n_cols
    seq_ids = seq[starts[:-1]]
    m = seq_ids.size
    bins = _grouped_csr(starts, doc, tokens, doc_bin, nb)
    lengths, spans = np.zeros(m), np.diff(starts).astype(np.int64)
    joint = np.zeros((k, nb))
    _lengths_joint(starts, doc, tokens, doc_cluster, doc_bin, lengths, joint)
    cols = {}
    for name, codes in doc_columns.items():
        codes = np.asarray(codes).astype(np.int64, copy=False)
        lo, hi = _lookup_range(doc, codes)
        if lo < 0:
            raise StrataInputError(f"column {name!r} needs one category id >= 0 per span", fix="encode it densely (0..n-1)")
        cols[name] = _grouped_csr(starts, doc, tokens, codes, hi + 1)
    return SequenceFeatures(seq_ids, clusters, bins, lengths, edges, joint, spans, cols)


def _lookup_range(doc: np.ndarray, values: np.ndarray) -> tuple[int, int]:
    """min and max of ``values[doc]``, in chunks on every core (no gathered copy)."""
    ranges = _chunk_ranges(doc, values, even_cuts(doc.size, n_chunks(doc.size)))
    return int(ranges[:, 0].min()), int(ranges[:, 1].max())


@njit(cache=True, parallel=True)
def _chunk_ranges(doc, values, cuts):
    out = np.empty((cuts.size - 1, 2), np.int64)
    for c in prange(cuts.size - 1):
        lo, hi = values[doc[cuts[c]]], values[doc[cuts[c]]]
        for i in range(cuts[c], cuts[c + 1]):
            lo, hi = min(lo, values[doc[i]]), max(hi, values[doc[i]])
        out[c, 0], out[c, 1] = lo, hi
    return out


def _grouped_csr(starts: np.ndarray, doc: np.ndarray, tokens: np.ndarray, col_of_doc: np.ndarray, n_cols: int) -> Csr:
    """Per group ``starts[g]:starts[g+1]`` of segments: tokens summed per column ``col_of_doc[doc]``,
    the groups in chunks on every core (each group's sums in its segments' order: the same on any
    number of threads)."""
    cuts = even_cuts(starts.size - 1, n_chunks(doc.size))
    indptr = np.zeros(starts.size, dtype=np.int64)
    _grouped_count(starts, doc, col_of_doc, n_cols, cuts, indptr)
    np.cumsum(indptr, out=indptr)
    indices, data = np.empty(int(indptr[-1]), np.int64), np.empty(int(indptr[-1]))
    _grouped_write(starts, doc, tokens, col_of_doc, n_cols, cuts, indptr, indices, data)
    return Csr(indptr, indices, data, int(n_cols))


@njit(parallel=True, cache=True)
def _grouped_count(starts, doc, col_of_doc, n_cols, cuts, indptr) -> None:
    """``indptr[g + 1]`` = distinct columns of group g, by chunks of groups ``cuts[c]:cuts[c+1]``."""
    for c in prange(cuts.size - 1):
        _grouped_fill(starts, doc, doc, col_of_doc, False, cuts[c], cuts[c + 1], indptr, np.empty(0, np.int64), np.empty(0),
                      np.full(n_cols, -1, np.int64), np.zeros(n_cols))


@njit(parallel=True, cache=True)
def _grouped_write(starts, doc, tokens, col_of_doc, n_cols, cuts, indptr, indices, data) -> None:
    """Each group's columns ascending and their token sums from ``indptr[g]`` on, by chunks of groups."""
    for c in prange(cuts.size - 1):
        _grouped_fill(starts, doc, tokens, col_of_doc, True, cuts[c], cuts[c + 1], indptr, indices, data,
                      np.full(n_cols, -1, np.int64), np.zeros(n_cols))


@njit(cache=True)
def _grouped_fill(starts, doc, tokens, col_of_doc, write, lo, hi, indptr, indices, data, stamp, acc) -> None:
    """Groups ``lo:hi``. Without ``write``: ``indptr[g + 1]`` = distinct columns of group g; with
    it: the group's columns ascending and their token sums from ``indptr[g]`` on."""
    for g in range(lo, hi):
        w = indptr[g]
        n = 0
        for i in range(starts[g], starts[g + 1]):
            c = col_of_doc[doc[i]]
            if stamp[c] != g:
                stamp[c] = g
                acc[c] = 0.0
                if write:
                    insert_sorted(indices, w, w + n, c)
                n += 1
            acc[c] += tokens[i]
        if write:
            for j in range(w, w + n):
                data[j] = acc[indices[j]]
        else:
            indptr[g + 1] = n


def _lengths_joint(starts, doc, tokens, doc_cluster, doc_bin, lengths, joint) -> None:
    """Each group's tokens into ``lengths`` and the tokens per (cluster, length bin) into ``joint``,
    in chunks of groups on every core, each chunk's joint counts apart, then added chunk by chunk
    (whole token counts: exact in any order, so the same on any number of threads)."""
    cuts = even_cuts(starts.size - 1, n_chunks(doc.size))
    parts = np.zeros((cuts.size - 1, *joint.shape))
    _lengths_joint_chunks(starts, doc, tokens, doc_cluster, doc_bin, lengths, parts, cuts)
    joint += parts.sum(axis=0)


@njit(cache=True, parallel=True)
def _lengths_joint_chunks(starts, doc, tokens, doc_cluster, doc_bin, lengths, parts, cuts) -> None:
    for c in prange(cuts.size - 1):
        joint = parts[c]
        for g in range(cuts[c], cuts[c + 1]):
            for i in range(starts[g], starts[g + 1]):
                t = tokens[i]
                lengths[g] += t
                joint[doc_cluster[doc[i]], doc_bin[doc[i]]] += t


def quantile_classes(values: np.ndarray, n_classes: int) -> np.ndarray:
    """Class 0..n-1 of each value: quantile classes of equal sequence counts (ties merge classes)."""
    v = np.asarray(values, dtype=np.float64)
    srt = np.sort(v)
    q = srt[np.minimum((np.arange(1, n_classes) * v.size) // n_classes, v.size - 1)]
    edges = np.unique(q)
    edges = edges[edges < srt[-1]]
    return np.searchsorted(edges, v, side="left").astype(np.int64)


def one_hot(classes: np.ndarray, value: float) -> Csr:
    """One column per class, ``value`` in each row's class column."""
    m = classes.size
    return Csr(np.arange(m + 1, dtype=np.int64), classes.astype(np.int64), np.full(m, value), int(classes.max()) + 1)
