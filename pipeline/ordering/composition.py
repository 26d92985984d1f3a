"""The sparse composition of sequences (c_s, l_s of Don't Shuffle, Optimize's f1-f3), the
prepared schedule every ordering metric reads, and the stream's cumulative error over its prefixes.

Beneath the characteristic families (``pipeline/ordering/families/``: a family's composition of a
schedule), the frozen boundary the ordering stage records (``frozen_boundary.py``) and the
ordering diagnostics (``pipeline.reports.diagnostics``, which measure with these).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.ordering import kernels as K
from pipeline.segments import as_integers, grouped


@dataclass(frozen=True)
class Composition:
    """Sparse characteristic vectors c_s: one entry per (sequence, group) with tokens > 0.

    Entries are sorted by sequence id, then group; ``tokens[i]`` = c_{seq[i], group[i]}.
    """

    seq: np.ndarray  # int64, or int32 (built from a packing's segments)
    group: np.ndarray  # int64, or int32
    tokens: np.ndarray  # int64, or int32
    n_sequences: int
    n_groups: int
    target: np.ndarray | None = None  # the shares deviations are measured against (a mixture's), else the schedule's own

    def global_share(self) -> np.ndarray:
        """tau_j (or kappa_b): the group's share of all tokens (Don't Shuffle, Optimize, step 1), or
        the target shares when the schedule realizes a mixture."""
        if self.target is not None:
            return self.target
        tot = K.group_tokens(self.group, self.tokens, self.n_groups).astype(np.float64)  # exact: a float64 bincount's sums
        return tot / tot.sum()

    def unique_per_sequence(self) -> np.ndarray:
        """Number of distinct groups in each sequence (indexed by sequence id)."""
        return np.bincount(self.seq, minlength=self.n_sequences)

    def l2_norm(self) -> np.ndarray:
        """||c_s||_2 in tokens (Don't Shuffle, Optimize, f2), indexed by sequence id."""
        return np.sqrt(K.square_sums(self.seq, self.tokens, self.n_sequences))


def _pair_sums(a: np.ndarray, g: np.ndarray, w: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sum ``w`` over equal (a, g) pairs; result sorted by (a, g)."""
    key = a * n_groups + g
    uniq, inv = np.unique(key, return_inverse=True)
    sums = np.bincount(inv, weights=w, minlength=uniq.size).astype(np.int64)
    return uniq // n_groups, uniq % n_groups, sums


def composition(seq: np.ndarray, group: np.ndarray, tokens: np.ndarray, n_sequences: int, n_groups: int) -> Composition:
    """Aggregate segment rows (sequence, group, tokens) into a :class:`Composition`."""
    s, g, t = _pair_sums(np.asarray(seq, np.int64), np.asarray(group, np.int64), np.asarray(tokens, np.int64), n_groups)
    keep = t > 0
    return Composition(s[keep], g[keep], t[keep], n_sequences, n_groups)


def composition_of_docs(seq: np.ndarray, doc: np.ndarray, tokens: np.ndarray, doc_group: np.ndarray, n_sequences: int,
                         n_groups: int) -> Composition:
    """:func:`composition` of segments whose group is their document's ``doc_group``: one pass of
    a kernel over segments grouped by sequence (a packing's order), no per-segment copies."""
    if not grouped(seq):
        return composition(seq, doc_group[doc], tokens, n_sequences, n_groups)
    return Composition(*K.composition_of_docs(seq, doc, tokens, as_integers(doc_group), n_groups), n_sequences, n_groups)


@dataclass(frozen=True)
class Schedule:
    """An ordering of packed sequences with everything the metrics need.

    ``order[p]`` is the sequence at position p; ``position[s]`` its inverse. ``clusters`` and
    ``bins`` are the sparse c_s and l_s; ``seg_*`` the segment rows (for document-level drift and
    documents per sequence). ``doc_source`` holds dense codes 0..S-1 of a per-document source
    label (indexed by doc_id) when one was given, else None.
    """

    order: np.ndarray
    position: np.ndarray
    clusters: Composition
    bins: Composition
    seg_seq: np.ndarray
    seg_tokens: np.ndarray
    seg_doc_length: np.ndarray
    bin_edges: np.ndarray
    seg_doc: np.ndarray
    doc_source: np.ndarray | None = None

    @property
    def n_sequences(self) -> int:
        return int(self.order.size)


def _order_of(position: np.ndarray) -> np.ndarray:
    order = np.empty_like(position)
    order[position] = np.arange(position.size, dtype=position.dtype)
    return order


def ordering_ids(ordering: pl.DataFrame | np.ndarray) -> np.ndarray:
    """Sequence ids in training order, from an ordering frame (position, sequence_id) or an array."""
    if isinstance(ordering, pl.DataFrame):
        missing = {"position", "sequence_id"} - set(ordering.columns)
        if missing:
            raise StrataInputError(
                f"ordering lacks column(s) {sorted(missing)}", fix="pass a frame with columns position, sequence_id"
            )
        return ordering.sort("position")["sequence_id"].to_numpy().astype(np.int64)
    return np.asarray(ordering, dtype=np.int64).ravel()


def log_spaced_points(n_sequences: int, n_points: int = 64) -> np.ndarray:
    """About ``n_points`` distinct integers log-spaced over 1..n_sequences (prefix lengths t)."""
    return np.unique(np.round(np.geomspace(1, n_sequences, max(n_points, 2))).astype(np.int64))


def prefix_totals(comp: Composition, position: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative group tokens T(t) (shape (len(t), G)) and tokens S(t) after the first t sequences."""
    t = np.asarray(t, dtype=np.int64)
    if t.size and (np.any(np.diff(t) <= 0) or t[0] < 1 or t[-1] > position.size):
        raise StrataInputError(
            "prefix lengths must increase within 1..M", fix="pass sorted distinct t (e.g. log_spaced_points)"
        )
    out = K.prefix_totals(_order_of(position), K.row_pointers(comp.seq, comp.n_sequences), comp.group, comp.tokens,
                          comp.n_groups, t)
    return out, out.sum(axis=1)


def prefix_errors(comp: Composition, position: np.ndarray, t: np.ndarray) -> np.ndarray:
    """||T(t) - tau S(t)||_2 / S(t) after the first t sequences (Don't Shuffle, Optimize's tracked error, relative)."""
    totals, s = prefix_totals(comp, position, t)
    dev = totals - np.outer(s, comp.global_share())
    return np.linalg.norm(dev, axis=1) / s
