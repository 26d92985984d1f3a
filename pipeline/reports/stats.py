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

Minimum detectable effect (MDE): from the seed-to-seed spread of the per-seed mean differences
``d_s = mean_u D[s, u]``: ``MDE = (z_0.975 + z_0.8) * sd(d_s) / sqrt(n_seeds)`` (two-sided 5%
test, 80% power, normal approximation) — the size of effect this many seeds can resolve; NaN
with fewer than 2 seeds.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

Z_MDE = 1.959963984540054 + 0.8416212335729143  # z_{0.975} + z_{0.80}

DELTA_SCHEMA = {
    "metric": pl.String, "strategy": pl.String, "baseline": pl.String, "delta": pl.Float64,
    "ci_low": pl.Float64, "ci_high": pl.Float64, "significant": pl.Boolean, "better": pl.Boolean,
    "n_seeds": pl.Int64, "n_units": pl.Int64, "mde": pl.Float64, "n_boot": pl.Int64, "interval": pl.String,
}


def paired_bootstrap(diff: np.ndarray, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of the mean of a (seeds, units) difference matrix, two-way bootstrap."""
    d = np.asarray(diff, dtype=np.float64)
    n_s, n_u = d.shape
    rng = np.random.default_rng(seed)
    ws = rng.multinomial(n_s, np.full(n_s, 1.0 / n_s), size=n_boot).astype(np.float64)
    wu = rng.multinomial(n_u, np.full(n_u, 1.0 / n_u), size=n_boot).astype(np.float64)
    reps = ((ws @ d) * wu).sum(1) / (n_s * n_u)
    a = (1.0 - level) / 2
    lo, hi = np.quantile(reps, [a, 1.0 - a])
    return float(d.mean()), float(lo), float(hi)


def paired_t_interval(per_seed: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of per-seed paired differences, Student t; NaN bounds below 2 seeds."""
    from scipy.stats import t

    x = np.asarray(per_seed, dtype=np.float64).ravel()
    mean = float(x.mean())
    if x.size < 2:
        return mean, math.nan, math.nan
    half = float(t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return mean, mean - half, mean + half


def minimum_detectable_effect(diff: np.ndarray) -> float:
    """``(z_0.975 + z_0.8) * sd(per-seed mean difference) / sqrt(n_seeds)`` (NaN below 2 seeds)."""
    per_seed = np.asarray(diff, dtype=np.float64).mean(axis=1)
    if per_seed.size < 2:
        return math.nan
    return float(Z_MDE * per_seed.std(ddof=1) / math.sqrt(per_seed.size))


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
        m = units.filter(pl.col("metric") == metric)
        base = m.filter(pl.col("strategy") == baseline).select("seed", "unit", pl.col("value").alias("base"))
        for strategy in m["strategy"].unique().sort().to_list():
            if strategy == baseline:
                continue
            pair = m.filter(pl.col("strategy") == strategy).join(base, on=["seed", "unit"], how="inner")
            if pair.is_empty():
                continue
            wide = pair.with_columns(d=pl.col("value") - pl.col("base")).pivot(on="unit", index="seed", values="d").drop("seed")
            d = wide.to_numpy().astype(np.float64)
            d = d[:, ~np.isnan(d).any(axis=0)]  # units every shared seed has
            if d.size == 0:
                continue
            if d.shape[1] == 1:
                (mean, lo, hi), how = paired_t_interval(d[:, 0]), "t"
            else:
                (mean, lo, hi), how = paired_bootstrap(d, n_boot, seed), "bootstrap"
            sig = bool(lo > 0 or hi < 0)  # False for NaN bounds
            good = mean > 0 if higher_is_better(metric) else mean < 0
            rows.append({"metric": metric, "strategy": strategy, "baseline": baseline, "delta": mean, "ci_low": lo,
                         "ci_high": hi, "significant": sig, "better": sig and good, "n_seeds": d.shape[0],
                         "n_units": d.shape[1], "mde": minimum_detectable_effect(d), "n_boot": n_boot, "interval": how})
    return pl.DataFrame(rows, schema=DELTA_SCHEMA)
