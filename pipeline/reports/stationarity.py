"""Stationarity of an ordering: every characteristic of the stream, by tenth and over the consumed
prefix, against the band that uniform shuffles of the same sequences span.

A scheduler that balances a few shares (Don't Shuffle, Optimize's f3: cluster and document-length-bin
token shares) can keep those flat while other characteristics drift, e.g. greedy f3 front-loads
mixed, short-document sequences. This module measures, for any ordering of a
:class:`~pipeline.reports.diagnostics.Schedule`:

Characteristics (per part of the stream):

- level characteristics (no scheduler targets them; a drift either way is a change of the data
  the model sees, so the band is two-sided):

  - ``clusters_per_seq``: mean over the part's sequences of the number of distinct clusters in
    the sequence;
  - ``docs_per_seq``: mean number of distinct documents (spans) in a sequence;
  - ``mean_doc_length``: the mean, over the part's tokens, of the stream length of the document
    each token comes from (as :func:`~pipeline.reports.diagnostics.decile_drift`);
  - ``concentration``: mean of ``||c_s||_2 / l_s`` (c_s: the sequence's tokens per cluster, l_s
    its length); 1 for a one-cluster sequence, about ``1/sqrt(n)`` for n equal clusters;

- share characteristics (``max_j |share_j(part) - tau_j|`` over the part's tokens, tau the
  share in the whole stream; 0 is ideal, so only the band's upper end matters):

  - ``cluster_share_dev`` and ``length_bin_share_dev`` (what f3 targets: ``targeted`` is true);
  - ``source_share_dev`` when the schedule carries a per-document source label with at least two
    distinct values.

Parts: tenth ``i`` holds positions ``[i M / 10, (i+1) M / 10)`` (``min(10, M)`` tenths when
``M < 10``, as ``decile_drift``); ``prefix`` is what training consumes, the first ``prefix``
positions; a trainer that runs past the end wraps into a new epoch, so ``prefix > M`` counts
every position ``prefix // M`` times and the first ``prefix % M`` once more.

Random's band: ``n_random`` (R) seeded uniform shuffles of the same sequences, from a seed stream
separate from the strategies' own (``SeedSequence(seed, spawn_key=(BAND_STREAM,))``), so the
``random`` strategy with the same seed is not one of them. The band is the *simultaneous envelope*
the shuffles span: per characteristic, mean m and standard deviation s of the shuffles' values
(the tenths pooled, as a shuffle's tenths are exchangeable; the prefix on its own); each shuffle's
largest standardized deviation over every characteristic and part, z_r = max |v - m| / s (share
characteristics: (v - m) / s, one-sided); the band is m -/+ z* s with z* = max_r z_r. A part is
``inside`` when ``band_lo <= value <= band_hi`` (share characteristics: ``value <= band_hi``), up
to a slack of 1e-9 relative plus 1e-12 for rounding (a prefix of whole epochs, whose shuffles all
agree, is inside).

Why an envelope and not each part's own min..max: an ordering is judged on 7 characteristics x 11
parts at once, and per-part ranges of R = 20 shuffles let a uniform shuffle leave some range in
about half of the cases (measured: 55% at R = 20, 18% at R = 100). The envelope bounds the whole
profile at once: an ordering that is itself a uniform shuffle, exchangeable with the R, has the
largest z of the R + 1 with probability 1 / (R + 1), so the check's false-alarm rate is about
1 / (R + 1) = 4.8% at R = 20 (2% at the default R = 50) whatever the number of characteristics
(``benchmarks/bench_stationarity.py --false-alarms``). A real drift leaves it by many band widths.

Everything is vectorized: per-sequence features are computed once, and each shuffle costs a few
gathers and bincounts over the sparse (sequence, group, tokens) table.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.ordering import kernels as K
from pipeline.ordering.composition import Composition, Schedule, composition_of_docs
from pipeline.render.markdown import table_lines
from pipeline.segments import docs_per_sequence, grouped
from pipeline.storage.atomic import write_npy
from pipeline.threads import prefetch

LEVEL = ("clusters_per_seq", "docs_per_seq", "mean_doc_length", "concentration")
SHARE = ("cluster_share_dev", "length_bin_share_dev", "source_share_dev")
TARGETED = frozenset({"cluster_share_dev", "length_bin_share_dev"})
LABELS = {
    "clusters_per_seq": "distinct clusters per sequence (mean)",
    "docs_per_seq": "distinct documents per sequence (mean)",
    "mean_doc_length": "mean document length of the tokens (tokens)",
    "concentration": r"$\|c_s\|_2\,/\,l_s$ (mean; 1 = one cluster)",
    "cluster_share_dev": r"$\max_j\,|\mathrm{share}_j - \tau_j|$ over clusters",
    "length_bin_share_dev": r"$\max_b\,|\mathrm{share}_b - \kappa_b|$ over length bins",
    "source_share_dev": r"$\max_s\,|\mathrm{share}_s - \mathrm{global}_s|$ over sources",
}
PREFIX = "prefix"
N_PARTS = 10
DEFAULT_SHUFFLES = 50
BAND_STREAM = 0x5174  # spawn key of the band's shuffles: not the stream of default_rng(seed)
RTOL, ATOL = 1e-9, 1e-12  # floating-point slack of "inside"
SCHEMA = {
    "strategy": pl.Utf8, "characteristic": pl.Utf8, "part": pl.Utf8, "value": pl.Float64,
    "band_lo": pl.Float64, "band_hi": pl.Float64, "inside": pl.Boolean, "targeted": pl.Boolean,
}


def _level_features(schedule: Schedule) -> np.ndarray:
    """(M, 6) per-sequence sums, indexed by sequence id: distinct clusters, distinct documents,
    ||c_s||_2 / l_s, sum of tokens x document stream length, tokens l_s, and 1 (the sequence)."""
    m = schedule.n_sequences
    seq, doc = schedule.seg_seq, schedule.seg_doc
    if grouped(seq):  # a packing's order: count each sequence's documents in place
        docs = docs_per_sequence(seq, doc, m)
    else:
        n_ids = int(doc.max()) + 1
        pairs = np.sort(seq * n_ids + doc)  # (sequence, document) keys
        docs = np.bincount(pairs[np.r_[True, pairs[1:] != pairs[:-1]]] // n_ids, minlength=m)
    length, weighted = K.token_sums(seq, schedule.seg_tokens, m, schedule.seg_doc_length)  # whole numbers: exact as floats
    return np.column_stack([
        schedule.clusters.unique_per_sequence(),
        docs,
        schedule.clusters.l2_norm() / length,
        weighted,
        length,
        np.ones(m),
    ]).astype(np.float64)


def _level_values(sums: np.ndarray) -> np.ndarray:
    """Level characteristics (columns, in :data:`LEVEL` order) from part sums of the features."""
    return np.column_stack([sums[:, 0] / sums[:, 5], sums[:, 1] / sums[:, 5], sums[:, 3] / sums[:, 4], sums[:, 2] / sums[:, 5]])


@dataclass(frozen=True)
class _Shares:
    """One composition's entries, ready for repeated part sums: entries sorted by sequence id,
    ``start[s]:start[s+1]`` the entries of sequence s, float weights, global counts and shares."""

    seq: np.ndarray
    group: np.ndarray
    weight: np.ndarray  # the entries' tokens (integers: their sums are exact in any order)
    start: np.ndarray
    total: np.ndarray
    tau: np.ndarray

    @classmethod
    def of(cls, comp: Composition) -> "_Shares":
        total = np.bincount(comp.group, weights=comp.tokens, minlength=comp.n_groups)
        start = np.r_[0, np.cumsum(np.bincount(comp.seq, minlength=comp.n_sequences))]
        return cls(comp.seq, comp.group, comp.tokens, start, total, comp.global_share())  # a mixture's target, if any

    def max_dev(self, counts: np.ndarray) -> np.ndarray:
        """max_j |counts_j / sum(counts) - tau_j| per row of ``counts``."""
        return np.abs(counts / counts.sum(axis=1, keepdims=True) - self.tau).max(axis=1)


def _share_comps(schedule: Schedule) -> dict[str, _Shares]:
    """The token compositions whose shares are measured, by share characteristic."""
    comps = {"cluster_share_dev": schedule.clusters, "length_bin_share_dev": schedule.bins}
    src = schedule.doc_source
    if src is not None:
        n_src = int(src.max()) + 1
        if np.count_nonzero(np.bincount(src[schedule.seg_doc], minlength=n_src)) >= 2:
            comps["source_share_dev"] = composition_of_docs(schedule.seg_seq, schedule.seg_doc, schedule.seg_tokens, src,
                                                            schedule.n_sequences, n_src)
    return {name: _Shares.of(comp) for name, comp in comps.items()}


class _Stream:
    """The sequences' features and the parts (tenths of M positions, the consumed prefix); the
    characteristics of any ordering of them by :meth:`values`."""

    def __init__(self, schedule: Schedule, prefix: int):
        m = schedule.n_sequences
        self.m, self.n = m, min(N_PARTS, m)
        self.part_of_pos = np.arange(m, dtype=np.int64) * self.n // m
        self.epochs, self.rest = divmod(int(prefix), m)  # prefix = whole epochs + the first `rest` positions
        self.features = np.ascontiguousarray(_level_features(schedule).T)  # (6, M): one row per feature
        self.feature_total = self.features.sum(axis=1)
        self.shares = _share_comps(schedule)
        self.names = list(LEVEL) + list(self.shares)

    def values(self, order: np.ndarray) -> np.ndarray:
        """(characteristics, n + 1) values of the ordering ``order`` (``order[p]`` = sequence at
        position p): the n tenths, then the prefix; rows in :attr:`names` order."""
        part_of_seq = np.empty(self.m, dtype=np.int64)
        part_of_seq[order] = self.part_of_pos
        head = order[: self.rest]  # the sequences of the prefix's partial epoch
        sums = K.part_feature_sums(part_of_seq, self.features, self.n)
        pre = self.epochs * self.feature_total + self.features[:, head].sum(axis=1)
        out = [_level_values(np.vstack([sums, pre])).T]
        for sh in self.shares.values():
            g = sh.total.size
            counts = K.part_group_tokens(part_of_seq, sh.seq, sh.group, sh.weight, self.n, g)
            lo, hi = sh.start[head], sh.start[head + 1]
            idx = np.repeat(hi - np.cumsum(hi - lo), hi - lo) + np.arange(int((hi - lo).sum()))
            pre_counts = self.epochs * sh.total + np.bincount(sh.group[idx], weights=sh.weight[idx], minlength=g)
            out.append(sh.max_dev(np.vstack([counts, pre_counts]))[None, :])
        return np.vstack(out)


def band_shuffles(stream: "_Stream", n_random: int, seed: int) -> np.ndarray:
    """(R, characteristics, n + 1): the values of ``n_random`` seeded uniform shuffles of the
    stream's sequences (the band's draws; they do not depend on the ordering judged)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(BAND_STREAM,)))
    # the draws (one core each, in the generator's order) on a thread of their own, ahead of the values
    draws = prefetch(rng.permutation(stream.m) for _ in range(n_random))
    return np.stack([stream.values(order) for order in draws])


def stationarity_table(
    schedule: Schedule, *, prefix: int, strategy: str = "ordering", n_random: int = DEFAULT_SHUFFLES, seed: int = 0,
    band_cache: Path | None = None,
) -> pl.DataFrame:
    """Every characteristic of ``schedule``'s ordering per tenth of the stream and over the first
    ``prefix`` sequences (``max_steps x batch_size``), with the band of ``n_random`` seeded uniform
    shuffles (see the module docstring). Returns tidy rows with :data:`SCHEMA`: characteristics in
    :data:`LEVEL` then :data:`SHARE` order, parts ``"0"`` .. ``"9"`` then ``"prefix"``.

    ``band_cache``: a ``.npy`` file for the shuffles' values (:func:`band_shuffles`), read when it
    exists, else written. The shuffles depend on the sequences, not on their order, so orderings of
    one packing (``random``, ``greedy``, ``greedy_block_shuffle``) share them: the caller names the
    file by everything they depend on (``band_key``); the values read are the ones computed."""
    if prefix < 1:
        raise StrataInputError(f"prefix of {prefix} sequences is empty", fix="pass max_steps x batch_size (>= 1)")
    if n_random < 1:
        raise StrataInputError(f"n_random={n_random} gives no band", fix=f"use at least one shuffle (default {DEFAULT_SHUFFLES})")
    stream = _Stream(schedule, prefix)
    names, n = stream.names, stream.n
    value = stream.values(schedule.order)
    shuffles = None
    if band_cache is not None and band_cache.is_file():
        try:
            shuffles = np.load(band_cache, allow_pickle=False)
        except (OSError, ValueError, EOFError):  # unreadable (e.g. cut short by a full disk): computed again
            shuffles = None
        if shuffles is not None and (shuffles.dtype != np.float64 or shuffles.shape != (n_random, *value.shape)):  # not this stream's
            shuffles = None
    if shuffles is None:
        shuffles = band_shuffles(stream, n_random, seed)  # (R, characteristics, n + 1)
        if band_cache is not None:
            write_npy(shuffles, band_cache)
    # one memory layout (each shuffle's block column-major, as values() builds it) for computed and
    # read values alike: numpy's multi-axis means sum in layout order, and the band's bits follow
    shuffles = np.stack([np.asfortranarray(v) for v in shuffles])
    one_sided = np.isin(names, SHARE)[:, None]
    lo, hi = _envelope(shuffles, n, one_sided)
    slack = RTOL * np.maximum(np.abs(lo), np.abs(hi)) + ATOL
    inside = (value <= hi + slack) & (one_sided | (value >= lo - slack))
    n_names, n_cols = value.shape
    part_names = [str(i) for i in range(n)] + [PREFIX]
    return pl.DataFrame({
        "strategy": [strategy] * (n_names * n_cols),
        "characteristic": np.repeat(names, n_cols),
        "part": part_names * n_names,
        "value": value.ravel(),
        "band_lo": lo.ravel(),
        "band_hi": hi.ravel(),
        "inside": inside.ravel(),
        "targeted": np.repeat([c in TARGETED for c in names], n_cols),
    }, schema=SCHEMA)


BAND_VERSION = 1  # raised whenever the band's values change for the same inputs (a cached band is then not read)


def band_key(**inputs: object) -> str:
    """A name for the cached band of ``inputs`` (content fingerprints of the files the stream is
    built from, the length bins, prefix, shuffles and seed): 32 hex characters."""
    text = json.dumps({"band_version": BAND_VERSION, **inputs}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _moments(shuffles: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation (characteristics, n + 1) of the shuffles' values (R,
    characteristics, n + 1): the first ``n`` parts (tenths) pooled, the prefix on its own."""
    mean = np.concatenate([shuffles[:, :, :n].mean(axis=(0, 2))[:, None].repeat(n, 1), shuffles[:, :, n:].mean(axis=0)], axis=1)
    sd = np.concatenate([shuffles[:, :, :n].std(axis=(0, 2))[:, None].repeat(n, 1), shuffles[:, :, n:].std(axis=0)], axis=1)
    return mean, np.maximum(sd, RTOL * np.abs(mean) + ATOL)


def standardized(values: np.ndarray, mean: np.ndarray, sd: np.ndarray, one_sided: np.ndarray) -> np.ndarray:
    """(v - m) / s per characteristic and part; absolute for the two-sided (level) characteristics."""
    z = (values - mean) / sd
    return np.where(one_sided, z, np.abs(z))


def _envelope(shuffles: np.ndarray, n: int, one_sided: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi), each (characteristics, n + 1): the simultaneous envelope of the shuffles' values
    (R, characteristics, n + 1), the first ``n`` parts pooled (see the module docstring)."""
    mean, sd = _moments(shuffles, n)
    z_max = float(standardized(shuffles, mean, sd, one_sided).max()) if shuffles.shape[0] else 0.0
    return mean - z_max * sd, mean + z_max * sd


def profiles(schedule: Schedule, prefix: int, orders: list[np.ndarray]) -> tuple[list[str], int, np.ndarray]:
    """The characteristics' names, the number of tenths n, and each order's values (len(orders),
    characteristics, n + 1): the n tenths, then the prefix (what :func:`stationarity_table` judges)."""
    stream = _Stream(schedule, prefix)
    return stream.names, stream.n, np.stack([stream.values(np.asarray(o)) for o in orders])


def envelope_ratio(value: np.ndarray, shuffles: np.ndarray, n: int, one_sided: np.ndarray) -> tuple[float, np.ndarray, float]:
    """How far an ordering's profile ``value`` (characteristics, n + 1) reaches into the shuffles'
    simultaneous envelope: (its largest standardized deviation / the envelope's z*, its largest
    standardized deviation per characteristic, z*). At most 1 exactly when every part is inside
    the band of :func:`stationarity_table` (up to its rounding slack)."""
    mean, sd = _moments(shuffles, n)
    per_char = standardized(value, mean, sd, one_sided).max(axis=1)
    z_star = float(standardized(shuffles, mean, sd, one_sided).max())
    return float(per_char.max()) / z_star, per_char, z_star


def empty_table() -> pl.DataFrame:
    """A table with :data:`SCHEMA` and no rows (an ordering with no schedule before training)."""
    return pl.DataFrame(schema=SCHEMA)


def sort_table(frame: pl.DataFrame, strategies: list[str]) -> pl.DataFrame:
    """The rows of ``strategies`` (e.g. read back from DuckDB, which keeps no order) in table
    order: strategies as listed, characteristics as :data:`LEVEL` + :data:`SHARE`, parts 0..9, prefix."""
    rank = {name: i for i, name in enumerate(LEVEL + SHARE)}
    return (
        frame.filter(pl.col("strategy").is_in(strategies))
        .with_columns(_s=pl.col("strategy").replace_strict({s: i for i, s in enumerate(strategies)}, return_dtype=pl.Int64),
                      _c=pl.col("characteristic").replace_strict(rank, default=len(rank), return_dtype=pl.Int64),
                      _p=pl.when(pl.col("part") == PREFIX).then(N_PARTS).otherwise(pl.col("part").cast(pl.Int64, strict=False)))
        .sort("_s", "_c", "_p")
        .drop("_s", "_c", "_p")
    )


def _where(part: str) -> str:
    return "the prefix" if part == PREFIX else f"tenth {part}"


def out_of_band(frame: pl.DataFrame) -> list[str]:
    """One line per part outside random's band, e.g. ``clusters_per_seq in tenth 9: 1.13 below
    random's band [1.95, 2.12]``; prefixed by the strategy when ``frame`` holds several."""
    several = frame["strategy"].n_unique() > 1
    lines = []
    for s, c, p, v, lo, hi in frame.filter(~pl.col("inside")).select(
        "strategy", "characteristic", "part", "value", "band_lo", "band_hi"
    ).iter_rows():
        side = "below" if v < lo and c not in SHARE else "above"
        lines.append(f"{s + ': ' if several else ''}{c} in {_where(p)}: {v:.4g} {side} random's band [{lo:.4g}, {hi:.4g}]")
    return lines


def out_of_band_summary(frame: pl.DataFrame) -> str:
    """The characteristics outside random's band and where, e.g. ``clusters_per_seq (tenths 0, 9;
    prefix); docs_per_seq (tenth 9)``; empty when every part is inside."""
    out = frame.filter(~pl.col("inside"))
    pieces = []
    for (strategy, name), rows in out.group_by("strategy", "characteristic", maintain_order=True):
        tenths = [p for p in rows["part"] if p != PREFIX]
        where = ([f"tenth{'s' if len(tenths) > 1 else ''} {', '.join(tenths)}"] if tenths else [])
        where += [PREFIX] if (rows["part"] == PREFIX).any() else []
        label = f"{strategy}: {name}" if out["strategy"].n_unique() > 1 else name
        pieces.append(f"{label} ({'; '.join(where)})")
    return "; ".join(pieces)


def characteristics(frame: pl.DataFrame) -> list[str]:
    """The characteristics in ``frame``, in table order."""
    return list(frame["characteristic"].unique(maintain_order=True))


def markdown(frame: pl.DataFrame, names: Iterable[str] | None = None) -> str:
    """One strategy's table as markdown: a row per characteristic, a column per part, bold where
    the value is outside random's band; then the tenths' and the prefix's band."""
    parts = list(frame["part"].unique(maintain_order=True))
    body = []
    for name in names or characteristics(frame):
        rows = frame.filter(pl.col("characteristic") == name)
        cells = [f"**{v:.4g}**" if not ok else f"{v:.4g}" for v, ok in zip(rows["value"], rows["inside"])]
        bands = [f"[{lo:.4g}, {hi:.4g}]" for lo, hi in zip(rows["band_lo"], rows["band_hi"])]
        body.append([name, "yes" if rows["targeted"][0] else "no", *cells, bands[0], bands[-1]])
    return "\n".join(table_lines(["characteristic", "targeted", *parts, "band (tenths)", "band (prefix)"], body))
