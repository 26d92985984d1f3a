"""Paired statistics of the ablation: the difference of each strategy to a baseline, with intervals.

Every strategy is trained once per seed and scored on the same units (held-out documents, or one
unit ``all`` for a metric that exists only as an aggregate). For strategy X and baseline R the
paired differences are ``D[s, u] = X[s, u] - R[s, u]`` over the seeds s and units u both have,
and the estimate is ``delta = mean(D)``.

Interval: a two-way (seeds x units) paired bootstrap — each replicate redraws the seeds and,
independently, the units with replacement and takes the mean of D over the redrawn grid; the
95% interval is the 2.5 / 97.5 percentile of ``n_boot`` replicates. Seeds and documents are both
sources of variance (a new seed is a new init *and* a new shuffle), so both are resampled; with
3 seeds the seed factor can take only 10 distinct multisets, so intervals are coarse and tend to
be narrow (bootstrap from few clusters under-covers) — read them as the least uncertainty there
is. A metric with a single unit (an aggregate such as WikiText perplexity or DCLM Core) has only
the seeds to resample, where a bootstrap of 2-3 values is degenerate; it gets the paired t
interval over seeds instead, ``mean ± t_{0.975, n-1} sd / sqrt(n)`` (none with one seed). A
difference is ``significant`` only when its interval excludes zero.

Variance model and minimum detectable effect (MDE). The held-out documents are the same for
every seed, so seeds and documents are crossed factors of ``D``:

    D[s, u] = delta + a_s + b_u + e_su,   Var a = sigma2_seed, Var b = sigma2_doc, Var e = sigma2_res

(a_s: the seed's init and shuffle; b_u: how much more the strategy helps or hurts document u than
random, the same for every seed; e_su: the rest). The mean of an n_s x n_u grid has

    Var(delta_hat) = sigma2_seed / n_s + sigma2_doc / n_u + sigma2_res / (n_s n_u)        (1)

(with sigma2_doc = 0 this is the nested design's sigma2_seed/n_s + sigma2_within/(n_u n_s)). The
components are the two-way ANOVA (one observation per cell) moment estimates, clipped at 0:

    MS_S = n_u * sum_s (dbar_s. - dbar)^2 / (n_s - 1)           E = sigma2_res + n_u sigma2_seed
    MS_U = n_s * sum_u (dbar_.u - dbar)^2 / (n_u - 1)           E = sigma2_res + n_s sigma2_doc
    MS_E = sum (D - dbar_s. - dbar_.u + dbar)^2 / ((n_s-1)(n_u-1))   E = sigma2_res             (2)

and ``MDE = (z_0.975 + z_0.8) * sqrt(Var(delta_hat))`` (two-sided 5% test, 80% power, normal
approximation): the smallest |delta| this many seeds and documents resolve. A metric with one
unit (an aggregate) cannot separate the components: Var(delta_hat) = sd(d_s)^2 / n_s. NaN with
fewer than 2 seeds. Power planning (``plan_run``) solves (1) for the seeds and documents a run
needs to resolve a given |delta|; ``power_table`` applies it to the held-out batch loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from pipeline.reports.paired import (  # noqa: F401 (the report's statistics, importable without polars)
    Z_MDE,
    VarianceComponents,
    delta_variance,
    minimum_detectable_effect,
    minimum_detectable_effect_of,
    paired_bootstrap,
    paired_delta,
    paired_t_interval,
    variance_components,
)

DELTA_SCHEMA = {
    "metric": pl.String, "strategy": pl.String, "baseline": pl.String, "delta": pl.Float64,
    "ci_low": pl.Float64, "ci_high": pl.Float64, "significant": pl.Boolean, "better": pl.Boolean,
    "n_seeds": pl.Int64, "n_units": pl.Int64, "mde": pl.Float64, "n_boot": pl.Int64, "interval": pl.String,
}


def offdiagonal(m: np.ndarray) -> np.ndarray:
    """The entries above the diagonal of a square matrix, as float64 (the cosines of distinct chunk pairs)."""
    m = np.asarray(m, dtype=np.float64)
    return m[np.triu_indices(m.shape[0], 1)]


def pooled_components(parts: list[VarianceComponents]) -> VarianceComponents:
    """The mean of several strategies' unclipped estimates (each unbiased for its component)."""
    ok = [p for p in parts if not math.isnan(p.seed)]
    if not ok:
        return VarianceComponents(math.nan, math.nan, math.nan, 0, 0)
    mean = lambda f: float(np.mean([getattr(p, f) for p in ok]))  # noqa: E731
    return VarianceComponents(mean("seed"), mean("doc"), mean("res"), min(p.n_seeds for p in ok), min(p.n_units for p in ok))


MAX_SEEDS = 1000  # the largest run plan_run proposes


def plan_run(vc: VarianceComponents, effect: float, max_units: int, min_units: int = 1) -> tuple[int | None, int | None]:
    """(seeds, documents) of the cheapest run that resolves ``|effect|`` at 80% power, two-sided 5%.

    Requires Var(delta_hat) <= V* = (|effect| / (z_0.975 + z_0.8))^2, eq. (1). Seeds cost a whole
    training run each and documents one forward pass each, so seeds are minimized first, at the
    most documents available (``max_units``): N = max(2, ceil((sigma2_seed + sigma2_res/M) /
    (V* - sigma2_doc/M))), then the fewest documents for that N: M = ceil((sigma2_doc +
    sigma2_res/N) / (V* - sigma2_seed/N)), but never fewer than ``min_units`` (the documents this
    run already scores). (None, None) when no run of at most ``MAX_SEEDS`` seeds and ``max_units``
    documents does, or the components are unknown.
    """
    if math.isnan(vc.seed) or not effect or math.isnan(effect):
        return None, None
    seed, doc, res = vc.clipped()
    target = (abs(effect) / Z_MDE) ** 2
    room = target - doc / max_units
    if room <= 0:
        return None, None
    n = max(2, math.ceil((seed + res / max_units) / room - 1e-12))
    if n > MAX_SEEDS:
        return None, None
    if vc.n_units == 1:  # an aggregate metric: no documents to add
        return n, 1
    m = math.ceil((doc + res / n) / (target - seed / n) - 1e-12) if doc + res > 0 else 1
    return n, min(max(m, min_units, 1), max_units)


def paired_differences(units: pl.DataFrame, metric: str, strategy: str, baseline: str) -> np.ndarray:
    """``D[s, u] = strategy - baseline`` of one metric over the seeds both have and the units every
    one of those seeds has (shape (0, 0) when they share nothing)."""
    m = units.filter(pl.col("metric") == metric)
    base = m.filter(pl.col("strategy") == baseline).select("seed", "unit", pl.col("value").alias("base"))
    pair = m.filter(pl.col("strategy") == strategy).join(base, on=["seed", "unit"], how="inner")
    if pair.is_empty():
        return np.empty((0, 0))
    wide = pair.with_columns(d=pl.col("value") - pl.col("base")).pivot(on="unit", index="seed", values="d").sort("seed").drop("seed")
    d = wide.to_numpy().astype(np.float64)
    return d[:, ~np.isnan(d).any(axis=0)]


def delta_table(units: pl.DataFrame, baseline: str = "random", n_boot: int = 2000, seed: int = 0,
                higher_is_better=lambda metric: False) -> pl.DataFrame:
    """Difference to ``baseline`` of every (metric, strategy): columns of ``DELTA_SCHEMA``.

    ``units``: strategy, seed, metric, unit, value (one row per scored unit). Pairs are the
    (seed, unit) cells both the strategy and the baseline have; ``better`` is true when the
    difference is significant and in the metric's good direction.
    """
    rows = []
    if units.is_empty() or baseline not in set(units["strategy"]):
        return pl.DataFrame(schema=DELTA_SCHEMA)
    for metric in units["metric"].unique().sort().to_list():
        for strategy in units.filter(pl.col("metric") == metric)["strategy"].unique().sort().to_list():
            if strategy == baseline:
                continue
            d = paired_differences(units, metric, strategy, baseline)
            if d.size == 0:
                continue
            rows.append({"metric": metric, "strategy": strategy, "baseline": baseline,
                         **paired_delta(d, n_boot, seed, higher_is_better(metric))})
    return pl.DataFrame(rows, schema=DELTA_SCHEMA)


# --- the positive control and the power of the run ------------------------------------------------

HELDOUT_METRIC = "heldout_batch/loss"
TARGET_EFFECT = 0.005  # Don't Shuffle, Optimize's largest gain: WikiText NLL 3.1362 -> 3.1196 (Table 1), 0.53%
POOLED = "pooled"  # the power table's row of the variance components pooled over the compared orderings


@dataclass(frozen=True)
class ControlVerdict:
    """Whether the positive control's held-out loss differs from the baseline's in the harmful
    direction. ``status``: detected (interval above 0) | not_detected (interval contains 0 or is
    undefined) | reversed (interval below 0: the harmful order looked *better*) | absent."""

    control: str
    baseline: str
    status: str
    delta: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan

    @property
    def detected(self) -> bool:
        return self.status == "detected"


def control_verdict(deltas: pl.DataFrame, control: str, baseline: str = "random", metric: str = HELDOUT_METRIC) -> ControlVerdict:
    """The control's row of ``deltas`` (``delta_table``) for ``metric``, judged: detected only when
    its 95% interval lies entirely above zero (the control is built to raise the loss)."""
    row = deltas.filter((pl.col("strategy") == control) & (pl.col("metric") == metric) & (pl.col("baseline") == baseline))
    if row.is_empty():
        return ControlVerdict(control, baseline, "absent")
    r = row.row(0, named=True)
    lo, hi = r["ci_low"], r["ci_high"]
    status = "detected" if lo > 0 else "reversed" if hi < 0 else "not_detected"  # NaN bounds: not detected
    return ControlVerdict(control, baseline, status, r["delta"], lo, hi)


POWER_SCHEMA = {
    "metric": pl.String, "strategy": pl.String, "baseline": pl.String, "baseline_mean": pl.Float64,
    "delta": pl.Float64, "delta_rel": pl.Float64, "sigma_seed": pl.Float64, "sigma_doc": pl.Float64,
    "sigma_res": pl.Float64, "n_seeds": pl.Int64, "n_units": pl.Int64, "mde": pl.Float64, "mde_rel": pl.Float64,
    "target": pl.Float64, "target_rel": pl.Float64, "seeds_needed": pl.Int64, "units_needed": pl.Int64,
    "units_floor": pl.Int64, "max_units": pl.Int64, "tokens_per_run": pl.Int64, "train_tokens": pl.Int64,
}


def power_table(units: pl.DataFrame, baseline: str = "random", control: str | None = None, metric: str = HELDOUT_METRIC,
                target_rel: float = TARGET_EFFECT, max_units: int | None = None, tokens_per_run: int | None = None) -> pl.DataFrame:
    """The power of the run and of the next one, for ``metric`` (columns of ``POWER_SCHEMA``).

    One row per strategy: its Δ, the components of eq. (2) as standard deviations, the MDE of this
    run (eq. 1 at its seeds x documents), and the run ``plan_run`` finds to resolve its observed
    |Δ| (``target``; a planning figure: an observed |Δ| that is not significant is a noisy guess of
    the true one). One row ``pooled``: the components averaged over the strategies other than the
    ``control`` (the control's document-by-seed spread is its own), the run that resolves
    ``target_rel`` of the baseline's mean loss. Documents can grow from this run's to ``max_units``
    (the held-out documents available; default: this run's), seeds to ``MAX_SEEDS``; ``train_tokens`` =
    seeds_needed x ``tokens_per_run``. Relative columns divide by the baseline's mean.
    """
    m = units.filter(pl.col("metric") == metric)
    if m.is_empty() or baseline not in set(m["strategy"]):
        return pl.DataFrame(schema=POWER_SCHEMA)
    base_mean = float(m.filter(pl.col("strategy") == baseline)["value"].mean())
    rows, parts = [], []

    def row(name: str, vc: VarianceComponents, delta: float, target: float) -> dict:
        cap = max(max_units or 0, vc.n_units)
        n, k = plan_run(vc, target, cap, vc.n_units)
        mde = minimum_detectable_effect_of(vc)
        floor = math.floor(vc.clipped()[1] / (target / Z_MDE) ** 2) + 1 if target and not math.isnan(vc.doc) else None
        return {"metric": metric, "strategy": name, "baseline": baseline, "baseline_mean": base_mean, "delta": delta,
                "delta_rel": delta / base_mean, "sigma_seed": math.sqrt(vc.clipped()[0]), "sigma_doc": math.sqrt(vc.clipped()[1]),
                "sigma_res": math.sqrt(vc.clipped()[2]), "n_seeds": vc.n_seeds, "n_units": vc.n_units, "mde": mde,
                "mde_rel": mde / base_mean, "target": abs(target), "target_rel": abs(target) / base_mean, "seeds_needed": n,
                "units_needed": k, "units_floor": floor, "max_units": cap, "tokens_per_run": tokens_per_run,
                "train_tokens": n * tokens_per_run if n is not None and tokens_per_run else None}

    for strategy in m["strategy"].unique().sort().to_list():
        if strategy == baseline:
            continue
        d = paired_differences(m, metric, strategy, baseline)
        if d.size == 0:
            continue
        vc = variance_components(d)
        rows.append(row(strategy, vc, float(d.mean()), float(d.mean())))
        if strategy != control:
            parts.append(vc)
    pooled = pooled_components(parts or [variance_components(paired_differences(m, metric, r["strategy"], baseline)) for r in rows])
    if rows and not math.isnan(pooled.seed):
        rows.append(row(POOLED, pooled, math.nan, target_rel * base_mean))
    return pl.DataFrame(rows, schema=POWER_SCHEMA)


def mde_by_checkpoint(curve: pl.DataFrame, baseline: str = "random") -> pl.DataFrame:
    """Δ and MDE of every strategy at every held-out checkpoint after step 0 (``heldout_curve``
    rows: strategy, seed, step, tokens_seen, unit, loss): how the run's resolution changed with
    the training tokens seen. Columns step, tokens_seen, strategy, delta, mde, baseline_mean."""
    schema = {"step": pl.Int64, "tokens_seen": pl.Int64, "strategy": pl.String, "delta": pl.Float64,
              "mde": pl.Float64, "baseline_mean": pl.Float64}
    rows = []
    if curve.is_empty() or baseline not in set(curve["strategy"]):
        return pl.DataFrame(schema=schema)
    for step in sorted(set(curve["step"].to_list()) - {0}):
        at = curve.filter(pl.col("step") == step)
        u = at.select("strategy", "seed", metric=pl.lit(HELDOUT_METRIC), unit="unit", value="loss")
        base = at.filter(pl.col("strategy") == baseline)
        if base.is_empty():
            continue
        tokens = int(at["tokens_seen"].max())
        for strategy in sorted(set(at["strategy"]) - {baseline}):
            d = paired_differences(u, HELDOUT_METRIC, strategy, baseline)
            if d.size:
                rows.append({"step": step, "tokens_seen": tokens, "strategy": strategy, "delta": float(d.mean()),
                             "mde": minimum_detectable_effect(d), "baseline_mean": float(base["loss"].mean())})
    return pl.DataFrame(rows, schema=schema)
