"""The worst window: Don't Shuffle, Optimize's objective measured as the paper writes it.

The paper's objective is ``max_j max_[a:b] |rho_j(T[a:b]) - rho_j(T)|``: the largest deviation of a
group's token share from its global share tau_j over *every* window ``[a:b]`` of the stream, not
only over the training batches (``batch_dev_*``) or the prefixes ``[0:t]`` (``prefix_error_*``).
An ordering can keep every batch and every prefix close to the mixture and still hold a stretch
of a few hundred sequences that leans to a few clusters; only the windows in between show it.

This module measures, for window lengths ``w = batch * 2**i`` (i = 0, 1, ..., every ``w <= M``
sequences), the worst window of each length: ``max over windows of max_j |tokens_j(window) /
tokens(window) - tau_j|``, the measure :func:`~pipeline.reports.diagnostics.batch_deviations`
takes of a batch (a group absent from the window deviates by tau_j; a schedule realizing a mixture
is measured against the mixture's target shares). Windows start at every multiple of ``batch``
(stride one batch) and hold whole batches, so ``w = batch`` is exactly the worst training batch;
the incomplete last batch is left out, as a trainer drops it.

Cost: one pass gathers each batch's tokens per group (sparse: one entry per group a batch holds),
then each length slides its window a batch at a time over a dense vector of the window's tokens
per group, adding the batch that enters and subtracting the one that leaves
(:func:`pipeline.ordering.kernels.worst_windows`); a window is computed only when a bound does not
already place it below the worst found, so the cost is about the composition's entries per length,
with no (sequences x groups) matrix.

Random's band: the same statistic for ``n_random`` seeded uniform shuffles of the same sequences
(:data:`SHUFFLES` by default; a seed stream of their own, ``SeedSequence(seed, spawn_key=(BAND_STREAM,))``),
reported per length as the shuffles' min, median and max. A worst window above random's max at a
length means the ordering has a stretch of that length less mixed than any of the shuffles'.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.ordering import kernels as K
from pipeline.render.markdown import table_lines
from pipeline.storage.atomic import write_npy


class Composition(Protocol):
    """What this module reads of :class:`pipeline.reports.diagnostics.Composition` (typed here,
    not imported: diagnostics imports this module)."""

    seq: np.ndarray
    group: np.ndarray
    tokens: np.ndarray
    n_sequences: int
    n_groups: int

    def global_share(self) -> np.ndarray: ...


class Schedule(Protocol):
    """What this module reads of :class:`pipeline.reports.diagnostics.Schedule`."""

    clusters: Composition
    bins: Composition
    position: np.ndarray
    n_sequences: int

SHUFFLES = 5  # R: uniform shuffles whose worst windows span random's band
BAND_STREAM = 0x5177  # spawn key of the band's shuffles: not the stationarity band's, nor default_rng(seed)'s
KINDS = ("clusters", "length_bins")
BAND_STATS = ("random_min", "random_median", "random_max")

Row = tuple[str, str, str, float]


def window_spans(n_sequences: int, batch: int) -> np.ndarray:
    """Window lengths in batches, ``1, 2, 4, ...`` up to the number of full batches (empty when
    the stream holds no full batch)."""
    if batch < 1:
        raise StrataInputError(f"batch size {batch} is impossible", fix="use a batch size >= 1")
    n_batches = n_sequences // batch
    return 2 ** np.arange(int(n_batches).bit_length(), dtype=np.int64) if n_batches else np.zeros(0, np.int64)


def window_lengths(n_sequences: int, batch: int) -> np.ndarray:
    """Window lengths w in sequences: ``batch * 2**i`` for every ``w <= n_sequences``."""
    return window_spans(n_sequences, batch) * batch


@dataclass(frozen=True)
class WorstWindows:
    """Per window length ``lengths[i]`` (sequences): the worst window's deviation ``worst[i]`` and
    the position of its first sequence ``start[i]`` (the first such window when several tie)."""

    lengths: np.ndarray
    worst: np.ndarray
    start: np.ndarray


def _ranks(tau: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each group's rank in descending-share order and the shares in that order (the "mex" of the
    present ranks gives the largest share of an absent group, as ``batch_deviations``)."""
    by_share = np.argsort(-tau, kind="stable")
    rank = np.empty_like(by_share)
    rank[by_share] = np.arange(by_share.size)
    return rank, np.asarray(tau[by_share], dtype=np.float64)


def _order(position: np.ndarray) -> np.ndarray:
    order = np.empty_like(position)
    order[position] = np.arange(position.size, dtype=position.dtype)
    return order


def _worst(comp: Composition, ptr: np.ndarray, order: np.ndarray, batch: int, spans: np.ndarray,
           tau: np.ndarray, rank: np.ndarray, tau_sorted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bptr, bgroup, btokens = K.batch_entries(order, ptr, comp.group, comp.tokens, comp.n_groups, batch, order.size // batch)
    return K.worst_windows(bptr, bgroup, btokens, tau, rank, tau_sorted, spans)


def worst_windows(comp: Composition, position: np.ndarray, batch: int) -> WorstWindows:
    """The worst window of every length ``batch * 2**i`` of the schedule ``position`` (see the
    module docstring): Don't Shuffle, Optimize's ``max_[a:b] max_j |rho_j(T[a:b]) - rho_j(T)|``
    over windows of whole batches starting at every batch."""
    spans = window_spans(position.size, batch)
    if not spans.size:
        return WorstWindows(spans, np.zeros(0), spans)
    tau = np.asarray(comp.global_share(), dtype=np.float64)
    rank, tau_sorted = _ranks(tau)
    worst, first = _worst(comp, K.row_pointers(comp.seq, comp.n_sequences), _order(position), batch, spans, tau, rank, tau_sorted)
    return WorstWindows(spans * batch, worst, first * batch)


def _compositions(schedule: Schedule) -> tuple[Composition, Composition]:
    return schedule.clusters, schedule.bins


def random_band(schedule: Schedule, batch: int, n_random: int = SHUFFLES, seed: int = 0) -> np.ndarray:
    """(kinds, n_random, lengths): the worst window of each length (:func:`window_lengths`) for
    ``n_random`` seeded uniform shuffles of the schedule's sequences, clusters then length bins.
    It depends on the sequences, not on their order: orderings of one packing share it."""
    if n_random < 1:
        raise StrataInputError(f"n_random={n_random} gives no band", fix=f"use at least one shuffle (default {SHUFFLES})")
    m = schedule.n_sequences
    spans = window_spans(m, batch)
    out = np.zeros((len(KINDS), n_random, spans.size))
    if not spans.size:
        return out
    prepared = []
    for comp in _compositions(schedule):
        tau = np.asarray(comp.global_share(), dtype=np.float64)
        prepared.append((comp, K.row_pointers(comp.seq, comp.n_sequences), tau, *_ranks(tau)))
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(BAND_STREAM,)))
    for r in range(n_random):
        order = rng.permutation(m)
        for k, (comp, ptr, tau, rank, tau_sorted) in enumerate(prepared):
            out[k, r] = _worst(comp, ptr, order, batch, spans, tau, rank, tau_sorted)[0]
    return out


def cached_band(schedule: Schedule, batch: int, n_random: int, seed: int, cache: Path | None) -> tuple[np.ndarray, bool]:
    """:func:`random_band`, read from ``cache`` (a ``.npy``) when it holds a band of this shape,
    else computed and written there; ``(band, read)``. The caller names the file by everything the
    band depends on (the sequences' content, the length bins, ``batch``, ``n_random``, ``seed``)."""
    shape = (len(KINDS), n_random, window_spans(schedule.n_sequences, batch).size)
    if cache is not None and cache.is_file():
        try:
            band = np.load(cache, allow_pickle=False)
        except (OSError, ValueError, EOFError):  # unreadable (e.g. cut short by a full disk): computed again
            band = None
        if band is not None and band.dtype == np.float64 and band.shape == shape:
            return band, True
    band = random_band(schedule, batch, n_random, seed)
    if cache is not None:
        write_npy(band, cache)
    return band, False


def window_rows(strategy: str, schedule: Schedule, batch: int, *, n_random: int = SHUFFLES, seed: int = 0,
                band: np.ndarray | None = None) -> list[Row]:
    """Tidy rows ``(strategy, metric, setting, value)``, setting ``w=<sequences>``, per kind
    (``clusters``, ``length_bins``) and window length: ``window_dev_<kind>_max`` (the worst
    window's deviation), ``window_dev_<kind>_worst_at`` (its first sequence's position) and
    random's band ``window_dev_<kind>_random_{min,median,max}`` over ``n_random`` shuffles
    (``band``: a :func:`random_band` already computed for these sequences). No rows when the stream
    holds no full batch."""
    lengths = window_lengths(schedule.n_sequences, batch)
    if not lengths.size:
        return []
    if band is None:
        band = random_band(schedule, batch, n_random, seed)
    rows: list[Row] = []
    for k, (kind, comp) in enumerate(zip(KINDS, _compositions(schedule))):
        got = worst_windows(comp, schedule.position, batch)
        stats = (band[k].min(axis=0), np.median(band[k], axis=0), band[k].max(axis=0))
        for i, w in enumerate(lengths):
            setting = f"w={w}"
            rows += [(strategy, f"window_dev_{kind}_max", setting, float(got.worst[i])),
                     (strategy, f"window_dev_{kind}_worst_at", setting, float(got.start[i]))]
            rows += [(strategy, f"window_dev_{kind}_{name}", setting, float(v[i])) for name, v in zip(BAND_STATS, stats)]
    return rows


def window_frame(metrics: pl.DataFrame, strategy: str) -> pl.DataFrame:
    """One strategy's window rows of ``metrics`` (the ``ordering_metrics`` rows) side by side:
    ``kind, w, worst, worst_at, random_min, random_median, random_max``, by kind then w; empty when
    it has none."""
    sub = metrics.filter((pl.col("strategy") == strategy) & pl.col("metric").str.starts_with("window_dev_"))
    schema = {"kind": pl.Utf8, "w": pl.Int64, "worst": pl.Float64, "worst_at": pl.Int64,
              **{name: pl.Float64 for name in BAND_STATS}}
    if sub.is_empty():
        return pl.DataFrame(schema=schema)
    parts = []
    for kind in KINDS:
        prefix = f"window_dev_{kind}_"
        rows = sub.filter(pl.col("metric").str.starts_with(prefix)).with_columns(
            stat=pl.col("metric").str.strip_prefix(prefix), w=pl.col("setting").str.strip_prefix("w=").cast(pl.Int64))
        if rows.is_empty():
            continue
        wide = rows.pivot(on="stat", index="w", values="value").sort("w").rename({"max": "worst"})
        parts.append(wide.with_columns(kind=pl.lit(kind), worst_at=pl.col("worst_at").cast(pl.Int64)))
    return pl.concat(parts).select(list(schema)).cast(schema) if parts else pl.DataFrame(schema=schema)


def markdown(frame: pl.DataFrame) -> str:
    """A :func:`window_frame` as a markdown table: a row per window length, per kind the worst
    window's deviation (bold when above random's max) and random's min / median / max."""
    if frame.is_empty():
        return "no full batch: no windows"
    lengths = sorted(set(frame["w"].to_list()))
    kinds = [k for k in KINDS if (frame["kind"] == k).any()]
    header = ["w (sequences)"] + [h for k in kinds for h in (k.replace("_", " "), "random min / median / max")]
    by = {(k, w): r for k, w, r in zip(frame["kind"], frame["w"], frame.iter_rows(named=True))}
    body = []
    for w in lengths:
        cells: list[object] = [w]
        for k in kinds:
            r = by.get((k, w))
            if r is None:
                cells += ["", ""]
                continue
            above = r["worst"] > r["random_max"]
            cells += [f"**{r['worst']:.4g}**" if above else f"{r['worst']:.4g}",
                      f"{r['random_min']:.4g} / {r['random_median']:.4g} / {r['random_max']:.4g}"]
        body.append(cells)
    return "\n".join(table_lines(header, body, "r" * len(header)))


def above_random(frame: pl.DataFrame) -> dict[str, list[int]]:
    """Per kind, the window lengths whose worst window is above random's max."""
    out: dict[str, list[int]] = {}
    for kind in KINDS:
        rows = frame.filter((pl.col("kind") == kind) & (pl.col("worst") > pl.col("random_max")))
        out[kind] = rows["w"].to_list()
    return out

