"""The paired statistics of the ablation report in numpy alone: the interval of a strategy's
difference to the baseline over (seeds x units), and its minimum detectable effect.

``pipeline/reports/stats.py`` explains the method (two-way bootstrap, the paired t interval of a
single-unit metric, the variance model behind the MDE) and builds the report's tables from these
functions; they live here so a run without polars (``benchmarks/gpu_check.py`` on a GPU machine)
computes its intervals exactly as the report does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z_MDE = 1.959963984540054 + 0.8416212335729143  # z_{0.975} + z_{0.80}


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


@dataclass(frozen=True)
class VarianceComponents:
    """Moment estimates of eq. (2), unclipped (pooling averages them; ``clipped`` is used)."""

    seed: float
    doc: float
    res: float
    n_seeds: int
    n_units: int

    def clipped(self) -> tuple[float, float, float]:
        return max(self.seed, 0.0), max(self.doc, 0.0), max(self.res, 0.0)


def variance_components(diff: np.ndarray) -> VarianceComponents:
    """sigma2_seed, sigma2_doc, sigma2_res of a (seeds, units) difference matrix, eq. (2); with one
    unit all variance is the seed's (sd of the per-seed values squared). NaN below 2 seeds."""
    d = np.asarray(diff, dtype=np.float64)
    n_s, n_u = d.shape
    if n_s < 2:
        return VarianceComponents(math.nan, math.nan, math.nan, n_s, n_u)
    if n_u == 1:
        return VarianceComponents(float(d[:, 0].var(ddof=1)), 0.0, 0.0, n_s, 1)
    rows, cols, grand = d.mean(1), d.mean(0), d.mean()
    ms_s = n_u * float(((rows - grand) ** 2).sum()) / (n_s - 1)
    ms_u = n_s * float(((cols - grand) ** 2).sum()) / (n_u - 1)
    ms_e = float(((d - rows[:, None] - cols[None, :] + grand) ** 2).sum()) / ((n_s - 1) * (n_u - 1))
    return VarianceComponents((ms_s - ms_e) / n_u, (ms_u - ms_e) / n_s, ms_e, n_s, n_u)


def delta_variance(vc: VarianceComponents, n_seeds: int, n_units: int) -> float:
    """Var(delta_hat) of a run of ``n_seeds`` x ``n_units``, eq. (1), from clipped components."""
    seed, doc, res = vc.clipped()
    return seed / n_seeds + doc / n_units + res / (n_seeds * n_units)


def minimum_detectable_effect_of(vc: VarianceComponents) -> float:
    """``(z_0.975 + z_0.8) * sqrt(Var(delta_hat))``, eq. (1) at the run's own seeds x units."""
    return math.nan if math.isnan(vc.seed) else float(Z_MDE * math.sqrt(delta_variance(vc, vc.n_seeds, vc.n_units)))


def minimum_detectable_effect(diff: np.ndarray) -> float:
    """The MDE of a (seeds, units) difference matrix, eqs. (1)-(2) (NaN below 2 seeds)."""
    return minimum_detectable_effect_of(variance_components(diff))


def paired_delta(d: np.ndarray, n_boot: int = 2000, seed: int = 0, higher_is_better: bool = False) -> dict:
    """One row of the report's delta table for a (seeds, units) difference matrix ``d`` (strategy -
    baseline): ``delta, ci_low, ci_high, significant, better, n_seeds, n_units, mde, n_boot,
    interval``. One unit: the paired t interval over seeds; more: the two-way bootstrap."""
    d = np.asarray(d, dtype=np.float64)
    if d.shape[1] == 1:
        (mean, lo, hi), how = paired_t_interval(d[:, 0]), "t"
    else:
        (mean, lo, hi), how = paired_bootstrap(d, n_boot, seed), "bootstrap"
    sig = bool(lo > 0 or hi < 0)  # False for NaN bounds
    good = mean > 0 if higher_is_better else mean < 0
    return {"delta": mean, "ci_low": lo, "ci_high": hi, "significant": sig, "better": sig and good,
            "n_seeds": d.shape[0], "n_units": d.shape[1], "mde": minimum_detectable_effect(d), "n_boot": n_boot,
            "interval": how}
