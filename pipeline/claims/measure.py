"""Each paper's measurable claim, reproduced on the user's corpus: what a claim measures from and
what it gives (DuckDB ``claims``, ``strata claims``).

One row per claim: the paper, the claim, the paper's own figure (quoted from its text, with where
it stands), Strata's figure with a 95% interval, and a verdict that the interval alone decides
(:func:`verdict`): *reproduced* when the whole interval lies on the claimed side of the claim's
threshold, *not reproduced* when it lies wholly on the other side, *inconclusive* otherwise (and
whenever there are too few units for an interval). Nothing here is entered by hand but the
papers' figures.

The claims are the registry ``pipeline.claims.papers`` (one module per paper); adding a claim is
one ``ClaimSpec`` in its paper's module, whose ``measure(data: ClaimData) -> list[Claim]`` raises
:class:`MissingData` when the data it needs does not exist in this data root (it is then listed as
not measured, with the reason). The computations are plain functions of arrays in the paper
modules (``prefix_indicators``, ``worst_best_gaps``, ``log_ratio_matrix``, ``spread_bootstrap``,
``boundary_ratios``, ``paired_units``), so tests can hand them cases with a known answer.

Intervals (the unit of resampling is named in each row's ``interval``): a two-way bootstrap
(``pipeline.reports.stats.paired_bootstrap``) over (random shuffles x prefixes), (seeds x probe
batches), (seeds x epoch boundaries) or (seeds x held-out documents); a one-way bootstrap over
random shuffles, over sequences, or over chunks. ``n_boot`` replicates, percentile interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import polars as pl

from pipeline.claims.papers import REGISTRY, ordered
from pipeline.errors import StrataInputError
from pipeline.reports import diagnostics as D
from pipeline.reports.stats import paired_bootstrap

Side = Literal[">", ">=", "<"]
VERDICTS = ("reproduced", "not reproduced", "inconclusive")

CLAIM_SCHEMA = {
    "key": pl.String, "paper": pl.String, "claim": pl.String, "paper_figure": pl.String, "paper_source": pl.String,
    "value": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64, "threshold": pl.Float64, "side": pl.String,
    "verdict": pl.String, "interval": pl.String, "n": pl.Int64, "detail": pl.String, "figure": pl.String,
}


def verdict(low: float, high: float, threshold: float, side: Side) -> str:
    """The verdict of an interval [low, high] on the claim ``value <side> threshold``.

    ``>``: reproduced when low > threshold, not reproduced when high < threshold. ``>=`` (a claim
    at the edge of the statistic's range, e.g. a fraction that must be 1): reproduced when low >=
    threshold, not reproduced when high < threshold. ``<``: reproduced when high < threshold, not
    reproduced when low > threshold. A NaN bound (too few units) is inconclusive.
    """
    if side not in (">", ">=", "<"):
        raise StrataInputError(f"unknown claim side {side!r}", fix="use '>', '>=' or '<'")
    if math.isnan(low) or math.isnan(high):
        return "inconclusive"
    if side == "<":
        return "reproduced" if high < threshold else "not reproduced" if low > threshold else "inconclusive"
    if (low > threshold) or (side == ">=" and low >= threshold):
        return "reproduced"
    return "not reproduced" if high < threshold else "inconclusive"


@dataclass(frozen=True)
class Claim:
    """One measured claim; ``value`` and its interval are Strata's, ``paper_figure`` the paper's."""

    key: str
    paper: str
    claim: str
    paper_figure: str
    paper_source: str
    value: float
    ci_low: float
    ci_high: float
    threshold: float
    side: Side
    interval: str
    n: int
    detail: str = ""
    figure: str = ""

    @property
    def verdict(self) -> str:
        return verdict(self.ci_low, self.ci_high, self.threshold, self.side)

    def row(self) -> dict:
        return {**{k: getattr(self, k) for k in CLAIM_SCHEMA if k != "verdict"}, "verdict": self.verdict}


def claims_frame(claims: list[Claim]) -> pl.DataFrame:
    """Claims as rows of :data:`CLAIM_SCHEMA` (the DuckDB table ``claims``)."""
    return pl.DataFrame([c.row() for c in claims], schema=CLAIM_SCHEMA)


class MissingData(Exception):
    """A claim's inputs do not exist in this data root; the message says what to run."""


@dataclass
class ClaimData:
    """Everything the claim functions read (``None`` / empty where the data root lacks it).

    ``schedule``: the base packing with greedy's order (its ``position``), for the ordering claims;
    ``random_positions``: positions of ``claims_shuffles`` random shuffles of the same sequences.
    ``diversity``: Diversity-ordered training's strategies (original, round_robin, stratified,
    bin_packing, and random, greedy beside them) at ``diversity_k`` clusters, each with its own
    packing. ``stable_rank``: the ``stable_rank`` table's rows; ``fidelity``: {strategy: n x n
    cosine matrix}; ``claim_log`` / ``claim_heldout`` / ``claim_arms``: the claims' own runs
    (``claim_runs``). ``table(name)`` reads any other warehouse table (None when absent). Claims
    may leave side tables in ``tables_out`` and figures in ``out_dir``.
    """

    out_dir: Path
    batch_size: int
    n_boot: int = 2000
    seed: int = 0
    schedule: D.Schedule | None = None
    random_positions: list[np.ndarray] = field(default_factory=list)
    diversity: dict[str, D.Schedule] = field(default_factory=dict)
    diversity_k: int = 0
    stable_rank: pl.DataFrame | None = None
    fidelity: dict[str, np.ndarray] = field(default_factory=dict)
    claim_log: pl.DataFrame | None = None
    claim_heldout: pl.DataFrame | None = None
    claim_arms: pl.DataFrame | None = None
    claim_sequences: pl.DataFrame | None = None  # paper-protocol packing runs: every sequence's training loss
    prefix: int = 0  # sequences training consumes (max_steps x batch_size): the stationarity claim's prefix
    table: Callable[[str], pl.DataFrame | None] = lambda name: None
    tables_out: dict[str, pl.DataFrame] = field(default_factory=dict)

    def figure(self, name: str) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        return self.out_dir / f"{name}.png"


def evaluate(data: ClaimData, names: list[str] | None = None,
             progress: Callable[[str], None] | None = None) -> tuple[list[Claim], dict[str, str]]:
    """Measure the registered claims in their order (or ``names``): ``(claims, {name: why not measured})``."""
    out: list[Claim] = []
    missing: dict[str, str] = {}
    for spec in [REGISTRY.get(name) for name in names] if names else ordered():
        if progress is not None:
            progress(spec.name)
        try:
            out += spec.measure(data)
        except MissingData as why:
            missing[spec.name] = str(why)
    return out, missing


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


def interval_2way(d: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float]:
    """(mean, low, high) of a (groups x units) matrix by the two-way bootstrap of
    ``paired_bootstrap``; NaN bounds with fewer than 2 cells (no interval from one value)."""
    d = np.asarray(d, dtype=np.float64)
    d = d.reshape(-1, 1) if d.ndim == 1 else d
    if d.size < 2:
        return float(d.mean()) if d.size else math.nan, math.nan, math.nan
    return paired_bootstrap(d, n_boot, seed)


def mean_replicates(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` bootstrap replicates of the mean of ``x`` (resampling its elements).

    Exact and cheap for a statistic with few distinct values (clusters per sequence): a
    resample's counts of the distinct values are multinomial, so the cost does not grow with
    ``x.size``.
    """
    values, counts = np.unique(np.asarray(x, dtype=np.float64), return_counts=True)
    draws = rng.multinomial(int(counts.sum()), counts / counts.sum(), size=n_boot)
    return draws @ values / counts.sum()


def percentile_interval(reps: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    a = (1.0 - level) / 2
    lo, hi = np.quantile(reps, [a, 1.0 - a])
    return float(lo), float(hi)
