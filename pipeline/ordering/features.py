"""Characteristic vectors of packed sequences (seed 000, "A Greedy Algorithm"; seed 002 eq. for J_sched).

For sequence s, ``c_{s,j}`` counts its tokens from cluster j and ``l_{s,b}`` its tokens from
documents whose length falls in quantile bin b; ``l_s`` = sum_j c_{s,j} is the sequence length
(variable lengths allowed, as seed 002 writes it). Both matrices are stored sparse (CSR): a
sequence holds a handful of documents, so only a few entries per row are nonzero.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.diagnostics import length_bin_edges, length_bins
from pipeline.errors import StrataInputError


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
    cluster_bin_tokens: np.ndarray  # (K, B_eff) tokens per (cluster, bin): kappa_{b|j} of seed 002

    @property
    def n_sequences(self) -> int:
        return self.sequence_ids.size


def _csr_from_pairs(rows: np.ndarray, cols: np.ndarray, weights: np.ndarray, n_rows: int, n_cols: int) -> Csr:
    key = rows * np.int64(n_cols) + cols
    uniq, inverse = np.unique(key, return_inverse=True)
    data = np.bincount(inverse, weights=weights, minlength=uniq.size).astype(np.float64)
    r = uniq // n_cols
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=n_rows), out=indptr[1:])
    return Csr(indptr, (uniq % n_cols).astype(np.int64), data, int(n_cols))


def sequence_features(
    seg_sequence: np.ndarray,
    seg_cluster: np.ndarray,
    seg_doc_length: np.ndarray,
    seg_tokens: np.ndarray,
    n_bins: int,
    seg_doc: np.ndarray | None = None,
) -> SequenceFeatures:
    """Build c_s and l_{s,b} from one row per document span placed in a sequence (vectorized).

    ``seg_doc_length`` is the length of the span's whole document (its stream length), used for
    the length bins; ``seg_tokens`` is the number of the span's tokens in the sequence. Bin edges
    are token-weighted quantiles (``pipeline.diagnostics.length_bin_edges``, shared with the
    metrics so the scheduler balances the very bins the diagnostics measure) over distinct
    documents when ``seg_doc`` is given, else over spans.
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
    if seg_doc is not None:
        _, first = np.unique(np.asarray(seg_doc, dtype=np.int64), return_index=True)
        edges = length_bin_edges(seg_doc_length[first], n_bins)
    else:
        edges = length_bin_edges(seg_doc_length, n_bins)
    seq_ids, rows = np.unique(seg_sequence, return_inverse=True)
    m = seq_ids.size
    k = int(seg_cluster.max()) + 1
    bin_of = length_bins(seg_doc_length, edges)
    clusters = _csr_from_pairs(rows, seg_cluster, seg_tokens, m, k)
    bins = _csr_from_pairs(rows, bin_of, seg_tokens, m, edges.size + 1)
    lengths = np.bincount(rows, weights=seg_tokens, minlength=m)
    nb = edges.size + 1
    joint = np.bincount(seg_cluster * nb + bin_of, weights=seg_tokens, minlength=k * nb).reshape(k, nb)
    return SequenceFeatures(seq_ids, clusters, bins, lengths, edges, joint)
