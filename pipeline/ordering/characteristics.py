"""Characteristic families the greedy balances (Don't Shuffle, Optimize, "A Greedy Algorithm", generalized).

Don't Shuffle, Optimize wants "the characteristics of the data we train on [to be] constant
throughout training" for *any* measurable trait; its f1 balances clusters, f3 adds a quantile
histogram of document lengths, f2 the L2 norm of c_s. Strata treats these as instances of one
open set of **families**, each with a weight w_f and a matrix x^f (one row per sequence). The
families are the entries of a registry, one file each in ``pipeline/ordering/families/`` (plugins
add more through ``STRATA_PLUGINS``); a name it lacks is a column of the documents table. The
built-in ones:

- *token families* (``level="tokens"``): x^f_{s,g} counts the tokens of sequence s in group g,
  the target t^f_g is the group's share of all tokens, and the family's running total grows by
  l_s per pick: ``cluster`` (c_{s,j}), ``length_bin`` (l_{s,b}), any categorical column of the
  documents table (e.g. ``source``, ``subdomain``), and ``norm`` (the single column ||c_s||_2 with
  target rho = sum ||c_s|| / sum l_s: f2's term);
- *sequence families* (``level="sequences"``): each sequence falls in one class, the target is the
  class's share of *sequences*, and the running total grows by one sequence per pick:
  ``concentration`` (quantile classes of ||c_s||_2 / l_s: a single-cluster sequence has 1, a
  sequence spread evenly over n clusters 1/sqrt(n)) and ``documents`` (quantile classes of the
  number of document spans in s). A sequence counts ``unit`` = mean l_s in its class column, so
  one off-target sequence costs about what one off-target sequence costs a token family (L^2).

The greedy minimizes sum_f w_f sum_g [(X^f_g + x^f_sg) - t^f_g (W^f + w^f_s)]^2 with W^f the
family's running total (S tokens, or unit * n sequences) and w^f_s = l_s or unit. Scaling a
family's x and t by sqrt(w_f) makes every weight 1, so all families become the columns of one
matrix (token columns first) and one set of inverted lists (``pipeline.ordering.greedy``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

import numpy as np
from numba import njit

from pipeline.errors import StrataInputError
from pipeline.names import OBJECTIVES
from pipeline.ordering import families as registry
from pipeline.ordering.features import Csr, SequenceFeatures

DEFAULT_CLASSES = 4


@dataclass(frozen=True)
class Family:
    """One characteristic family of the objective: its name, weight and (sequence families) classes."""

    name: str
    weight: float = 1.0
    classes: int = DEFAULT_CLASSES

    @property
    def level(self) -> Literal["tokens", "sequences"]:
        return self.spec.level

    @property
    def spec(self) -> registry.FamilySpec:
        """Its entry of the families' registry (``pipeline/ordering/families/``), or the documents column."""
        return registry.spec_of(self.name)

    @staticmethod
    def parse(text: str) -> "Family":
        """``name[:weight[:classes]]``, e.g. ``cluster``, ``length_bin:1``, ``concentration:1:4``, ``source:0.5``."""
        fix = "write a family as name[:weight[:classes]], e.g. 'concentration:1:4' or 'source:0.5'"
        parts = str(text).strip().split(":")
        if not parts[0] or len(parts) > 3:
            raise StrataInputError(f"cannot read the family {text!r}", fix=fix)
        try:
            weight = float(parts[1]) if len(parts) > 1 else 1.0
            classes = int(parts[2]) if len(parts) > 2 else DEFAULT_CLASSES
        except ValueError:
            raise StrataInputError(f"cannot read the family {text!r}", fix=fix) from None
        fam = Family(parts[0], weight, classes)
        if len(parts) == 3 and fam.level == "tokens":
            raise StrataInputError(f"token family {fam.name!r} takes no classes", fix=f"write '{fam.name}:{weight:g}'")
        fam.check()
        return fam

    def check(self) -> None:
        if not np.isfinite(self.weight) or self.weight < 0:
            raise StrataInputError(f"family {self.name!r} has weight {self.weight}", fix="use a finite weight >= 0")
        if self.level == "sequences" and self.classes < 2:
            raise StrataInputError(
                f"family {self.name!r} has {self.classes} classes", fix="use at least 2 quantile classes (default 4)"
            )

    def __str__(self) -> str:
        base = f"{self.name}:{self.weight:g}"
        return f"{base}:{self.classes}" if self.level == "sequences" else base


STATIONARY = (  # the families `stationary` adds to f3: (name, weight, classes)
    ("concentration", 0.25, 8),
    ("documents", 0.25, 8),
    ("cluster_count", 0.25, 8),
    ("norm", 0.1, 0),
)


def preset(objective: str, lam: float) -> tuple[Family, ...]:
    """The families of a named objective (Don't Shuffle, Optimize's f1/f2/f3; Strata's ``stationary``).

    f1 = clusters; f3 = clusters + lam * length bins; f2 = clusters + lam * (N - rho S)^2 (its L2
    norm term). ``stationary`` (the default) = f3 plus what holds the *kind* of sequence at its
    share throughout the stream, which f3 leaves free to drift (it front-loads mixed, short-document
    sequences): 8 quantile classes each of ||c_s||/l_s, of the number of document spans and of the
    number of distinct clusters, each class at its share of sequences (weight 0.25 per family), and
    f2's norm term at weight 0.1, which pins the mean concentration inside the classes. Chosen on held-out synthetic
    instances (K = 30-1000, Zipf cluster sizes, log-normal lengths, L = 256 and 2048) as the
    lightest set whose every tenth stays inside random's band for clusters and documents per
    sequence, document length and concentration at a per-batch deviation within 1.1x of f3's
    (docs/ordering.md, "Drift"; ``benchmarks/bench_order.py --drift``).
    """
    if objective not in OBJECTIVES or objective == "custom":
        raise StrataInputError(f"unknown objective {objective!r}", fix=f"use one of {', '.join(o for o in OBJECTIVES if o != 'custom')}")
    if lam < 0 or not np.isfinite(lam):
        raise StrataInputError(f"lambda={lam} is impossible", fix="use a finite lambda >= 0 (default 1.0)")
    base = (Family("cluster", 1.0),)
    if objective == "f1":
        return base
    if objective == "f2":
        return base + (Family("norm", lam),)
    out = base + (Family("length_bin", lam),)
    if objective == "stationary":
        out += tuple(Family(n, w, c or DEFAULT_CLASSES) for n, w, c in STATIONARY)
    return out


def objective_families(objective: str, lam: float, families: Sequence[str | Family] = ()) -> tuple[Family, ...]:
    """The families an ordering balances: ``families`` when given (``objective`` must then be
    ``custom`` or omitted), else the preset of ``objective``. Zero-weight families are dropped."""
    if objective == "custom" or families:
        if objective not in ("custom", "") and families:
            raise StrataInputError(
                f"both objective={objective!r} and families={list(map(str, families))} are given",
                fix="set objective: custom to use your own families, or drop `families` to use the preset",
            )
        if not families:
            raise StrataInputError("objective `custom` needs `families`",
                                   fix="list them, e.g. families: [cluster:1, length_bin:1, source:0.5]")
        fams = tuple(f if isinstance(f, Family) else Family.parse(f) for f in families)
    else:
        fams = preset(objective, lam)
    names = [f.name for f in fams]
    if len(set(names)) != len(names):
        raise StrataInputError(f"a family is named twice in {names}", fix="name each family once")
    for f in fams:
        f.check()
    kept = tuple(f for f in fams if f.weight > 0)
    if not kept:
        raise StrataInputError("every family has weight 0", fix="give at least one family a weight > 0")
    return kept


def cluster_norms(features: SequenceFeatures) -> np.ndarray:
    """||c_s||_2 per sequence (tokens)."""
    c = features.clusters
    return _row_norms(c.indptr, c.data)


@njit(cache=True)
def _row_norms(indptr, data):
    out = np.zeros(indptr.size - 1)
    for r in range(indptr.size - 1):
        acc = 0.0
        for k in range(indptr[r], indptr[r + 1]):
            acc += data[k] * data[k]
        out[r] = np.sqrt(acc)
    return out


def concentration(features: SequenceFeatures) -> np.ndarray:
    """||c_s||_2 / l_s per sequence (1 for a single-cluster sequence)."""
    return cluster_norms(features) / features.lengths


def _scaled(x: "Csr | RowEntries", scale: float) -> "Csr | RowEntries":
    if scale == 1.0:
        return x
    if isinstance(x, RowEntries):
        return RowEntries(x.cols, x.values * scale, x.n_cols)
    return Csr(x.indptr, x.indices, x.data * scale, x.n_cols)


@dataclass(frozen=True)
class RowEntries:
    """A matrix with exactly one entry per row, held compactly: each row's column (the smallest
    integer type that holds them) and its value (one float for all rows, or one per row).

    A sequence family's classes and the ``norm`` column are such matrices; as a :class:`Csr` they
    take 24 bytes a sequence (index pointer, column, value), held here in 1-10, so the blocked
    greedies hold the objective's matrix for 10M sequences in about 130 MB and build each pool's
    rows as a :class:`Csr` (``take_rows``) with the very values the full matrix would hold."""

    cols: np.ndarray  # (M,) column of each row
    values: "np.ndarray | float"  # (M,) value of each row, or one value for every row
    n_cols: int

    @staticmethod
    def compact(x: Csr) -> "Csr | RowEntries":
        """``x`` as :class:`RowEntries` when every row holds exactly one entry, else ``x``."""
        m = x.n_rows
        if x.indices.size != m or not np.array_equal(x.indptr, np.arange(m + 1)):
            return x
        dtype = np.min_scalar_type(max(x.n_cols - 1, 0))
        constant = m > 0 and x.data.dtype == np.float64 and bool(np.all(x.data == x.data[0]))
        return RowEntries(x.indices.astype(dtype), float(x.data[0]) if constant else x.data, x.n_cols)

    @property
    def n_rows(self) -> int:
        return self.cols.size

    def _values(self, rows: "np.ndarray | None" = None) -> np.ndarray:
        n = self.cols.size if rows is None else rows.size
        if isinstance(self.values, float):
            return np.full(n, self.values)
        return self.values if rows is None else self.values[rows]

    def take_rows(self, rows: np.ndarray) -> Csr:
        rows = np.asarray(rows, dtype=np.int64)
        return Csr(np.arange(rows.size + 1, dtype=np.int64), self.cols[rows].astype(np.int64), self._values(rows), self.n_cols)

    def column_totals(self) -> np.ndarray:
        return np.bincount(self.cols, weights=self._values(), minlength=self.n_cols)

    @property
    def indptr(self) -> np.ndarray:
        return np.arange(self.cols.size + 1, dtype=np.int64)

    @property
    def indices(self) -> np.ndarray:
        return self.cols.astype(np.int64)

    @property
    def data(self) -> np.ndarray:
        return self._values()


def family_matrix(features: SequenceFeatures, family: Family, unit: float) -> Csr:
    """x^f of one family for every row of ``features`` (unscaled by the weight): its registry
    entry's matrix (``pipeline/ordering/families/``), or the documents column of that name."""
    return family.spec.matrix(features, family.classes, unit)


def _hstack(parts: Sequence[Csr]) -> Csr:
    """Column-wise concatenation of CSR matrices with the same rows (columns offset in order).

    Each row takes the parts' entries in part order: with every part's columns ascending within
    a row, that is the (row, column) order, written straight into the result (numba, no sort).
    """
    m = parts[0].n_rows
    indptr = np.zeros(m + 1, dtype=np.int64)
    for p in parts:
        indptr[1:] += np.diff(p.indptr)
    np.cumsum(indptr, out=indptr)
    offsets = np.cumsum([0] + [p.n_cols for p in parts])
    cols = np.empty(int(indptr[-1]), dtype=np.int64)
    data = np.empty(int(indptr[-1]), dtype=np.float64)
    fill = indptr[:-1].copy()
    for p, o in zip(parts, offsets):
        if not _append_rows(p.indptr, p.indices, np.asarray(p.data, np.float64), int(o), fill, cols, data):
            raise StrataInputError("a characteristic matrix has unsorted columns within a row",
                                   fix="build it with pipeline.ordering.features")
    return Csr(indptr, cols, data, int(offsets[-1]))


@njit(cache=True)
def _append_rows(indptr, indices, values, offset, fill, cols, data) -> bool:
    """Append each row's entries (columns + ``offset``) at ``fill[row]``; False if a row's columns
    do not ascend."""
    for r in range(indptr.size - 1):
        w = fill[r]
        for k in range(indptr[r], indptr[r + 1]):
            if k > indptr[r] and indices[k] <= indices[k - 1]:
                return False
            cols[w] = indices[k] + offset
            data[w] = values[k]
            w += 1
        fill[r] = w
    return True


@dataclass(frozen=True)
class Characteristics:
    """All families of an objective as one matrix x (M x G): token columns first, then sequence
    columns; each family's columns scaled by sqrt(weight); ``unit`` = a sequence's weight in a
    sequence column; ``spans`` = the column range of each family.

    The families' matrices (``parts``) are kept apart and joined into ``x`` on first use: the
    blocked greedy takes each block's rows of the parts and joins only those, so the whole
    matrix is never built (the cluster and length-bin parts are the features' own arrays)."""

    parts: tuple["Csr | RowEntries", ...]  # each family's matrix, scaled, in column order (one entry a row: RowEntries)
    n_token_cols: int
    unit: float
    total_weight: float
    family_columns: Mapping[str, tuple[int, int]]

    @functools.cached_property
    def x(self) -> Csr:
        return _hstack(self.parts)

    def take_rows(self, rows: np.ndarray) -> "Characteristics":
        return Characteristics(tuple(p.take_rows(rows) for p in self.parts), self.n_token_cols, self.unit, self.total_weight,
                               self.family_columns)

    @property
    def n_cols(self) -> int:
        return sum(p.n_cols for p in self.parts)

    def column_totals(self) -> np.ndarray:
        return np.concatenate([p.column_totals() for p in self.parts])

    def targets(self, lengths: np.ndarray) -> np.ndarray:
        """t: each token column's share of the rows' tokens, each sequence column's share of the rows (scaled)."""
        tot = self.column_totals()
        t = np.empty_like(tot)
        nt = self.n_token_cols
        t[:nt] = tot[:nt] / float(np.sum(lengths))
        t[nt:] = tot[nt:] / (self.unit * len(lengths))
        return t


def characteristics(features: SequenceFeatures, families: Sequence[Family]) -> Characteristics:
    """Build the objective's matrix for ``features`` (see the module docstring)."""
    unit = float(np.mean(features.lengths))
    ordered = [f for f in families if f.level == "tokens"] + [f for f in families if f.level == "sequences"]
    parts, spans, start = [], {}, 0
    for fam in ordered:
        x = _scaled(RowEntries.compact(family_matrix(features, fam, unit)), float(np.sqrt(fam.weight)))
        parts.append(x)
        spans[fam.name] = (start, start + x.n_cols)
        start += x.n_cols
    n_token = sum(p.n_cols for p, f in zip(parts, ordered) if f.level == "tokens")
    return Characteristics(tuple(parts), n_token, unit, float(sum(f.weight for f in families)), spans)
