"""Sequential ablation statistics: an anytime-valid confidence sequence for Δ = strategy − baseline,
its verdicts, and the round planner of ``strata ablate``.

Why a confidence sequence, not a fixed-sample interval. ``strata ablate`` looks at the interval
after every round and stops a strategy once it has a verdict; a 95% interval read at every look
excludes zero under Δ = 0 far more often than 5% of the time. A confidence sequence (CS) is a
sequence of intervals that hold *simultaneously* at every look with probability ≥ 1 − α, so
stopping whenever a verdict appears (or continuing after a kill) keeps the error rates. It is
chosen over an alpha-spending group-sequential design (O'Brien-Fleming / Lan-DeMets) because the
number of rounds is not known in advance here (it follows the budget and the measured spreads)
and a spending function needs the maximum information fixed before the first look.

The method: Robbins' **normal-mixture confidence sequence** (Robbins 1970, "Statistical methods
related to the law of the iterated logarithm"; in the form of Howard, Ramdas, McAuliffe & Sekhon
2021, "Time-uniform, nonparametric, nonasymptotic confidence sequences", eq. (14)). For the paired
model of the report (``pipeline.reports.stats``),

    D[s, u] = Δ + a_s + b_u + e_su,    Var(Δ̂) = σ²_seed/n_s + σ²_doc/n_u + σ²_res/(n_s n_u)      (1)

rounds only ever add seeds and documents, so the grids are nested, and then
Cov(Δ̂_j, Δ̂_k) = Var(Δ̂_k) for an earlier look j: S_k = I_k (Δ̂_k − Δ), with the information
I_k = 1/Var(Δ̂_k), is a Gaussian process with independent increments in I (a Brownian motion
observed at the looks). Mixing the likelihood ratio exp(λS − λ²I/2) over λ ~ N(0, 1/ρ) gives the
nonnegative martingale sqrt(ρ/(I+ρ)) exp(S²/(2(I+ρ))); by Ville's inequality it passes 1/α with
probability ≤ α at *any* look, which is

    |Δ̂_k − Δ| ≤ w(I_k) = sqrt((I_k + ρ) · log((I_k + ρ) / (ρ α²))) / I_k      for every k.       (2)

ρ sets where the boundary is tightest. Writing ρ = r·I, w(I) = c(r)/sqrt(I) with
c(r)² = (1 + r) log((1 + r)/(r α²)), so the best r does not depend on I: ρ = r*·I*, where I* is the
information the campaign plans for (below). ρ is fixed by α, the power and the margin before
any data is seen (a data-dependent ρ would void (2)). At α = 0.05, c(r*) = 3.03 against 1.96 for
a single look: the price of looking as often as one likes.

The variances are estimated (eq. (2) of ``pipeline.reports.stats``, two-way ANOVA), so the CS is
the plug-in one (an asymptotic confidence sequence in the sense of Waudby-Smith et al. 2021,
"Time-uniform central limit theory and asymptotic confidence sequences"). With the 3 seeds of a
pilot the seed component has 2 degrees of freedom, so each look's z boundary b = w·sqrt(I) is
carried to the same tail probability of a Student t with Satterthwaite's degrees of freedom of
the variance estimate (MS_S + MS_U − MS_E)/(n_s n_u): half-width = se · t_df⁻¹(Φ(b)). The
simulation (``simulate_campaigns``; ``benchmarks/bench_ablate.py``) measures the error rates
that result.

Verdicts (``verdict``), for a metric where lower is better (a loss; reversed otherwise):
*better* when the whole CS lies below 0, *worse* when above; *equivalent* within ±margin when the
CS lies inside (−margin, +margin): two one-sided tests (Δ ≤ −margin rejected and Δ ≥ +margin
rejected), each at the sequential level α/2 since both sides come from one 1 − α sequence (TOST
at α would use 1 − 2α; this is the conservative side). Otherwise *unresolved*. Under Δ = 0 a
better/worse verdict needs the CS to miss the true Δ, so it happens in ≤ α of campaigns
however many rounds run; under |Δ| ≥ margin an equivalence verdict does too.

Planning (``design``, ``target_grid``, ``plan_round``): the campaign wants, at the effect of interest
m (the margin), power 1 − β to call a true |Δ| = m: m − w(I*) ≥ z_{1−β}/sqrt(I*), i.e.
I* = ((c(r*) + z_{1−β}) / m)². The cheapest nested grid (N seeds, M documents) with
Var(Δ̂) ≤ 1/I* (eq. (1) at the measured components) is the target; a round moves towards it,
at most doubling the seeds, taking the documents at once (a document is one forward pass per run,
a seed a whole training run), within what the budget has left.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import polars as pl

from pipeline.errors import StrataInputError
from pipeline.reports.stats import POOLED, VarianceComponents, power_table, variance_components
from pipeline.reports.tables import run_units

ALPHA = 0.05
POWER = 0.8
VERDICTS = ("better", "worse", "equivalent", "unresolved")


def _c2(r: float, alpha: float) -> float:
    return (1.0 + r) * math.log((1.0 + r) / (r * alpha * alpha))


def mixture_ratio(alpha: float = ALPHA) -> tuple[float, float]:
    """(r*, c(r*)): the ρ/I that minimizes the half-width of (2) at information I, and the
    half-width there in units of 1/sqrt(I) (golden-section search on log r)."""
    lo, hi = math.log(1e-6), math.log(1e3)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    for _ in range(200):
        if _c2(math.exp(a), alpha) < _c2(math.exp(b), alpha):
            hi = b
        else:
            lo = a
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    r = math.exp((lo + hi) / 2)
    return r, math.sqrt(_c2(r, alpha))


@dataclass(frozen=True)
class Design:
    """The campaign's fixed choices: margin m (the effect of interest, in the metric's units), α,
    power, the planned information I* and the mixture's ρ = r*·I*."""

    margin: float
    alpha: float
    power: float
    info_target: float
    rho: float
    c: float


def design(margin: float, alpha: float = ALPHA, power: float = POWER) -> Design:
    """The design for effect ``margin`` (> 0): I* = ((c(r*) + z_power)/m)², ρ = r*·I*."""
    from scipy.stats import norm

    if not (margin > 0 and math.isfinite(margin)):
        raise ValueError(f"margin must be a positive number, got {margin!r}")
    r, c = mixture_ratio(alpha)
    info = ((c + float(norm.ppf(power))) / margin) ** 2
    return Design(margin, alpha, power, info, r * info, c)


def half_width(info: float, rho: float, alpha: float = ALPHA) -> float:
    """w(I) of eq. (2): the CS's half-width at information I (known variance)."""
    if not info > 0:
        return math.inf
    return math.sqrt((info + rho) * math.log((info + rho) / (rho * alpha * alpha))) / info


@dataclass(frozen=True)
class Interval:
    """One strategy at one look: Δ̂, the CS (low, high), its se and degrees of freedom, the grid,
    and the components of eq. (1) (variances, clipped at 0)."""

    delta: float
    low: float
    high: float
    se: float
    df: float
    n_seeds: int
    n_units: int
    sigma2_seed: float
    sigma2_doc: float
    sigma2_res: float

    def components(self) -> VarianceComponents:
        return VarianceComponents(self.sigma2_seed, self.sigma2_doc, self.sigma2_res, self.n_seeds, self.n_units)


def _satterthwaite(d: np.ndarray) -> tuple[float, float]:
    """(variance of the grand mean, its Satterthwaite degrees of freedom) from the mean squares of
    a (seeds, units) matrix, the components clipped at 0 as eq. (1) uses them."""
    n_s, n_u = d.shape
    vc = variance_components(d)
    seed, doc, res = vc.clipped()
    var = seed / n_s + doc / n_u + res / (n_s * n_u)
    if n_u == 1:
        return var, float(n_s - 1)
    # var * n_s n_u = [seed>0] MS_S + [doc>0] MS_U + (1 - [seed>0] - [doc>0]) MS_E (a clipped component
    # drops its mean square and its share of MS_E); Satterthwaite's df of that combination
    ms = [(res + n_u * seed, float(seed > 0), n_s - 1), (res + n_s * doc, float(doc > 0), n_u - 1),
          (res, 1.0 - (seed > 0) - (doc > 0), (n_s - 1) * (n_u - 1))]
    num = sum(m * c for m, c, _ in ms) ** 2
    den = sum((m * c) ** 2 / f for m, c, f in ms if c and f > 0)
    df = num / den if den > 0 else math.inf
    return var, max(1.0, df)


def sequential_interval(diff: np.ndarray, dsg: Design) -> Interval:
    """The CS of eq. (2) for the mean of a (seeds, units) difference matrix, with the t correction
    of its estimated variance. Infinite bounds below 2 seeds (no variance to estimate)."""
    from scipy.stats import norm, t

    d = np.asarray(diff, dtype=np.float64)
    n_s, n_u = d.shape
    mean = float(d.mean()) if d.size else math.nan
    if n_s < 2:
        return Interval(mean, -math.inf, math.inf, math.nan, math.nan, n_s, n_u, math.nan, math.nan, math.nan)
    seed, doc, res = variance_components(d).clipped()
    var, df = _satterthwaite(d)
    if var <= 0:
        return Interval(mean, mean, mean, 0.0, df, n_s, n_u, seed, doc, res)
    se = math.sqrt(var)
    b = half_width(1.0 / var, dsg.rho, dsg.alpha) / se  # the z boundary at this look
    tail = float(norm.sf(b))
    crit = float(t.isf(tail, df)) if tail > 0 else b
    h = se * max(crit, b)
    return Interval(mean, mean - h, mean + h, se, df, n_s, n_u, seed, doc, res)


def verdict(low: float, high: float, margin: float, higher_is_better: bool = False) -> str:
    """better / worse (the CS excludes 0), equivalent (the CS inside ±margin), else unresolved."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "unresolved"
    if high < 0 or low > 0:
        return ("better" if low > 0 else "worse") if higher_is_better else ("better" if high < 0 else "worse")
    if -margin < low and high < margin:
        return "equivalent"
    return "unresolved"


# --- planning ---------------------------------------------------------------------------------------


def grid_variance(sigma2: tuple[float, float, float], n_seeds: int, n_units: int) -> float:
    seed, doc, res = sigma2
    return seed / n_seeds + doc / n_units + res / (n_seeds * n_units)


@dataclass(frozen=True)
class Target:
    """The cheapest grid (seeds, units) with Var(Δ̂) ≤ 1/I*, or infeasible with the documents that
    would be needed (``units_floor``: the fewest with σ²_doc/M < 1/I*)."""

    seeds: int | None
    units: int | None
    feasible: bool
    units_floor: int | None
    reason: str = ""


MAX_SEEDS = 1000


def target_grid(sigma2: tuple[float, float, float], dsg: Design, n_seeds: int, n_units: int, max_units: int,
                cost_seed: float = 1.0, cost_unit: float = 0.0) -> Target:
    """The cheapest (N ≥ n_seeds, n_units ≤ M ≤ max_units) with Var(Δ̂) ≤ 1/I*: cost of the seeds
    added (``cost_seed`` each) plus the documents scored (``cost_unit`` per run and document)."""
    seed, doc, res = (max(0.0, float(x)) for x in sigma2)
    if any(math.isnan(x) for x in (seed, doc, res)):
        return Target(None, None, False, None, "no variance estimate (fewer than 2 seeds)")
    v = 1.0 / dsg.info_target
    floor = math.floor(doc / v) + 1 if doc > 0 else 1
    if floor > max_units:
        return Target(None, None, False, floor, f"σ²_doc/M ≥ 1/I* for every M ≤ {max_units} documents")
    best = None
    for m in range(max(n_units, floor, 1), max_units + 1):
        room = v - doc / m
        if room <= 0:
            continue
        n = max(n_seeds, 2, math.ceil((seed + res / m) / room - 1e-12))
        if n > MAX_SEEDS:
            continue
        cost = (n - n_seeds) * cost_seed + (n * m - n_seeds * n_units) * cost_unit
        if best is None or cost < best[0] - 1e-12:
            best = (cost, n, m)
    if best is None:
        return Target(None, None, False, floor, f"more than {MAX_SEEDS} seeds at every M ≤ {max_units}")
    return Target(best[1], best[2], True, floor)


@dataclass
class StrategyState:
    """What the planner knows of one strategy: its grid and components, whether it has a verdict."""

    name: str
    n_seeds: int
    n_units: int
    sigma2: tuple[float, float, float]
    resolved: bool


@dataclass
class RoundPlan:
    """Seeds and documents per active strategy for the next round, the baseline's seeds (the most
    any strategy gets), its cost, and each strategy's target grid. ``stop``: why no round is run."""

    seeds: dict[str, int]
    units: int
    baseline_seeds: int
    cost: float
    targets: dict[str, Target] = field(default_factory=dict)
    stop: str = ""

    def as_dict(self) -> dict:
        return {**asdict(self), "targets": {k: asdict(v) for k, v in self.targets.items()}}


def round_cost(seeds: dict[str, int], baseline_seeds: int, units: int, have: dict[str, int], have_baseline: int,
               have_units: int, cost_run: float, cost_unit: float) -> float:
    """Training runs added (each strategy's new seeds and the baseline's) times ``cost_run``, plus
    every (run, document) scored anew times ``cost_unit``."""
    runs = sum(max(0, n - have.get(s, 0)) for s, n in seeds.items()) + max(0, baseline_seeds - have_baseline)
    all_now = sum(seeds.values()) + baseline_seeds
    all_before = sum(min(have.get(s, 0), n) for s, n in seeds.items()) + min(have_baseline, baseline_seeds)
    scored = all_now * units - all_before * have_units
    return runs * cost_run + max(0, scored) * cost_unit


def plan_round(states: list[StrategyState], dsg: Design, baseline_seeds: int, max_units: int, budget_left: float,
               cost_run: float, cost_unit: float = 0.0, growth: float = 2.0) -> RoundPlan:
    """The next round: each unresolved strategy moves to min(its target's seeds, ⌈growth·n⌉, at
    least n + 1), the documents to the largest target among them (capped at ``max_units``), the
    baseline to the most seeds any strategy gets; then, while the round costs more than
    ``budget_left``, the strategy with the most seeds to add gives one up. Empty (``stop`` says
    why) when every strategy has a verdict, none can be resolved at all, or one more seed does not
    fit the budget."""
    active = [s for s in states if not s.resolved]
    have = {s.name: s.n_seeds for s in states}
    have_units = min((s.n_units for s in states), default=0)
    if not active:
        return RoundPlan({}, have_units, baseline_seeds, 0.0, stop="every strategy has a verdict")
    targets = {s.name: target_grid(s.sigma2, dsg, s.n_seeds, s.n_units, max_units, cost_run * 2, cost_unit * 2)
               for s in active}
    seeds: dict[str, int] = {}
    units = have_units
    for s in active:
        t = targets[s.name]
        if t.feasible:
            want = t.seeds
            units = max(units, t.units)
        else:  # no grid within the documents resolves it: add seeds anyway (it may be resolved at a larger Δ)
            want = MAX_SEEDS
            units = max(units, max_units)
        seeds[s.name] = max(s.n_seeds + 1, min(want, math.ceil(growth * s.n_seeds)))
    units = min(units, max_units)

    def total() -> float:
        return round_cost(seeds, max(seeds.values(), default=0), units, have, baseline_seeds, have_units, cost_run, cost_unit)

    while seeds and total() > budget_left + 1e-9:
        name = max(seeds, key=lambda k: (seeds[k] - have[k], k))
        if seeds[name] - have[name] <= 1:
            break
        seeds[name] -= 1
    if total() > budget_left + 1e-9:
        for name in list(seeds):  # documents alone, if they fit
            seeds[name] = have[name]
        if units > have_units and total() <= budget_left + 1e-9:
            return RoundPlan(seeds, units, baseline_seeds, total(), targets)
        need = round_cost({s.name: s.n_seeds + 1 for s in active}, max(baseline_seeds, max(s.n_seeds + 1 for s in active)),
                          have_units, have, baseline_seeds, have_units, cost_run, cost_unit)
        return RoundPlan({}, have_units, baseline_seeds, 0.0, targets,
                         stop=f"budget spent: one more seed per open strategy costs {need:.4g}, {budget_left:.4g} left")
    return RoundPlan(seeds, units, max(baseline_seeds, max(seeds.values())), total(), targets)


def remaining_need(states: list[StrategyState], dsg: Design, baseline_seeds: int, max_units: int, cost_run: float,
                   cost_unit: float = 0.0) -> dict[str, dict]:
    """For each unresolved strategy, the grid its target needs and the cost from here (runs of the
    strategy and of the baseline): what an ``unresolved`` verdict states."""
    out = {}
    for s in states:
        if s.resolved:
            continue
        t = target_grid(s.sigma2, dsg, s.n_seeds, s.n_units, max_units, cost_run * 2, cost_unit * 2)
        if t.feasible:
            cost = round_cost({s.name: t.seeds}, max(baseline_seeds, t.seeds), t.units, {s.name: s.n_seeds},
                              baseline_seeds, s.n_units, cost_run, cost_unit)
        else:
            cost = math.nan
        out[s.name] = {"seeds": t.seeds, "units": t.units, "feasible": t.feasible, "units_floor": t.units_floor,
                       "reason": t.reason, "cost": cost}
    return out


# --- simulation ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairedModel:
    """The paired-difference model D = Δ + a_s + b_u + e_su (standard deviations in the metric's
    units) and the baseline's mean (for relative effects)."""

    sigma_seed: float
    sigma_doc: float
    sigma_res: float
    baseline_mean: float


def simulate_campaign(model: PairedModel, delta: float, dsg: Design, rng: np.random.Generator, *, pilot_seeds: int = 3,
                      pilot_units: int = 64, max_units: int = 71, budget_runs: float = 200.0, n_strategies: int = 1,
                      growth: float = 2.0) -> dict:
    """One campaign of ``n_strategies`` strategies (each with true difference ``delta``) against a
    baseline, run exactly as ``strata ablate`` runs it (pilot, looks, ``plan_round``), on data drawn
    from ``model``: a pool of ``max_units`` document effects b_u per strategy, a seed effect a_s per
    (strategy, seed) and a residual per cell, drawn once so that every look sees nested grids of the
    same campaign. Budget in training runs. Returns the verdicts, rounds, seeds and runs used."""
    pool_s = MAX_SEEDS
    names = [f"s{i}" for i in range(n_strategies)]
    a = {n: None for n in names}
    b = {n: rng.normal(0.0, model.sigma_doc, max_units) for n in names}
    e = {n: None for n in names}
    cap = int(min(pool_s, budget_runs + pilot_seeds + 2))
    for n in names:
        a[n] = rng.normal(0.0, model.sigma_seed, cap)
        e[n] = rng.normal(0.0, model.sigma_res, (cap, max_units))
    seeds = {n: pilot_seeds for n in names}
    base_seeds, units = pilot_seeds, min(pilot_units, max_units)
    spent = (n_strategies + 1) * pilot_seeds
    result = {n: "unresolved" for n in names}
    rounds = 0
    while True:
        rounds += 1
        states = []
        for n in names:
            if result[n] != "unresolved":
                states.append(StrategyState(n, seeds[n], units, (0, 0, 0), True))
                continue
            k = seeds[n]
            d = delta + a[n][:k, None] + b[n][None, :units] + e[n][:k, :units]
            iv = sequential_interval(d, dsg)
            result[n] = verdict(iv.low, iv.high, dsg.margin)
            states.append(StrategyState(n, k, units, (iv.sigma2_seed, iv.sigma2_doc, iv.sigma2_res), result[n] != "unresolved"))
        plan = plan_round(states, dsg, base_seeds, max_units, budget_runs - spent, 1.0, 0.0, growth)
        if plan.stop or not plan.seeds and plan.units == units:
            break
        spent += sum(max(0, v - seeds[k]) for k, v in plan.seeds.items()) + max(0, plan.baseline_seeds - base_seeds)
        for k, v in plan.seeds.items():
            seeds[k] = min(v, cap)
        base_seeds, units = plan.baseline_seeds, plan.units
    return {"verdicts": result, "rounds": rounds, "seeds": dict(seeds), "units": units, "runs": spent}


def simulate_campaigns(model: PairedModel, delta: float, dsg: Design, n: int, seed: int = 0, **kw) -> dict:
    """``n`` campaigns of one strategy with true difference ``delta``: the share of each verdict,
    and the mean rounds, seeds, documents and training runs."""
    rng = np.random.default_rng(seed)
    out = [simulate_campaign(model, delta, dsg, rng, **kw) for _ in range(n)]
    verdicts = [o["verdicts"]["s0"] for o in out]
    shares = {v: sum(x == v for x in verdicts) / n for v in VERDICTS}
    return {"delta": delta, "n": n, **{f"p_{v}": shares[v] for v in VERDICTS},
            "rounds": float(np.mean([o["rounds"] for o in out])), "seeds": float(np.mean([o["seeds"]["s0"] for o in out])),
            "units": float(np.mean([o["units"] for o in out])), "runs": float(np.mean([o["runs"] for o in out])),
            "runs_max": int(max(o["runs"] for o in out))}


def fit_paired_model(db_path, baseline: str = "random", metric: str = "heldout_batch/loss", control: str | None = "cluster_sorted",
                     strategies: list[str] | None = None) -> tuple[PairedModel, dict]:
    """The paired-difference model fitted on the runs a data root's DuckDB holds: for each strategy
    (but ``control``) its (seeds, units) differences to ``baseline`` on ``metric`` (``heldout_curve``'s
    last step for ``heldout_batch/loss``, else ``eval_units`` / ``eval_results``, as the report reads
    them), the components of eq. (2) of ``pipeline.reports.stats`` pooled over the strategies as the
    power statement pools them. Returns the model and what it was fitted on (strategies, seeds,
    units, the database). A clear ``StrataInputError`` when the database has no such runs."""
    path = Path(db_path)
    if not path.is_file():
        raise StrataInputError("no DuckDB file to fit the paired model on", path=path,
                               fix="pass a data root's strata.duckdb after `strata demo` or `strata run` trained its runs")
    with duckdb.connect(str(path), read_only=True) as con:
        have = {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        read = {t: con.sql(f"SELECT * FROM {t}").pl() for t in ("heldout_curve", "eval_results", "eval_units") if t in have}
    units = run_units(read.get("heldout_curve"), read.get("eval_results"), read.get("eval_units"))
    units = units.filter(pl.col("metric") == metric)
    if strategies is not None:
        units = units.filter(pl.col("strategy").is_in([baseline, *strategies]))
    power = power_table(units, baseline, control, metric=metric)
    pooled = power.filter(pl.col("strategy") == POOLED)
    if pooled.is_empty():
        raise StrataInputError(f"no paired runs of {metric!r} against {baseline!r} with 2 seeds or more", path=path,
                               fix=f"train {baseline} and another strategy with at least 2 seeds (strata demo trains 3)")
    r = pooled.row(0, named=True)
    fitted = sorted(set(power["strategy"]) - {POOLED, control})
    return (PairedModel(r["sigma_seed"], r["sigma_doc"], r["sigma_res"], r["baseline_mean"]),
            {"database": str(path), "metric": metric, "baseline": baseline, "strategies": fitted,
             "n_seeds": r["n_seeds"], "n_units": r["n_units"]})
