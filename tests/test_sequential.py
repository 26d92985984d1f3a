"""The sequential statistics of ``strata ablate``: the confidence sequence, verdicts, the planner and
a small version of the simulation (the full one: benchmarks/bench_ablate.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.reports import sequential as Q

DEMO = Q.PairedModel(sigma_seed=0.0223, sigma_doc=0.0884, sigma_res=0.1127, baseline_mean=6.9856)  # docs/training.md


def test_mixture_boundary_is_tightest_at_the_planned_information_and_wider_than_one_look():
    r, c = Q.mixture_ratio(0.05)
    for other in (r / 3, r * 3):
        assert Q._c2(other, 0.05) > c * c
    d = Q.design(0.035)
    assert d.rho == pytest.approx(r * d.info_target)
    assert Q.half_width(d.info_target, d.rho) == pytest.approx(c / math.sqrt(d.info_target))
    assert 2.9 < c < 3.2  # against 1.96 for a single look
    with pytest.raises(ValueError, match="positive"):
        Q.design(0.0)


def test_known_variance_sequence_covers_brownian_motion_at_every_look():
    """Ville's inequality: a random walk observed at 50 looks leaves the boundary in <= alpha of paths."""
    rng = np.random.default_rng(3)
    d = Q.design(0.1)
    info = np.linspace(d.info_target / 50, 2 * d.info_target, 50)
    steps = rng.normal(0, 1, (4000, 50)) * np.sqrt(np.diff(np.concatenate([[0], info])))
    s = np.cumsum(steps, 1)  # S(I) = I (delta_hat - delta)
    w = np.array([Q.half_width(i, d.rho) for i in info])
    crossed = (np.abs(s / info) > w).any(1).mean()
    naive = (np.abs(s / np.sqrt(info)) > 1.96).any(1).mean()  # a 95% interval read at every look
    assert crossed <= 0.05 and naive > 0.2


def test_interval_verdicts_and_degenerate_grids():
    d = Q.design(0.05)
    rng = np.random.default_rng(0)
    iv = Q.sequential_interval(-0.2 + rng.normal(0, 0.05, (6, 40)), d)
    assert iv.high < 0 and Q.verdict(iv.low, iv.high, d.margin) == "better"
    assert Q.verdict(iv.low, iv.high, d.margin, higher_is_better=True) == "worse"
    assert Q.verdict(-0.01, 0.02, 0.05) == "equivalent" and Q.verdict(-0.06, 0.02, 0.05) == "unresolved"
    assert Q.verdict(0.01, 0.02, 0.05) == "worse"
    one = Q.sequential_interval(rng.normal(0, 1, (1, 10)), d)
    assert math.isinf(one.low) and Q.verdict(one.low, one.high, 0.05) == "unresolved"
    # three seeds: Satterthwaite's degrees of freedom widen the interval over the z boundary
    three = Q.sequential_interval(rng.normal(0, 1, (3, 1)) * 0.05 + rng.normal(0, 0.05, (3, 30)), d)
    assert three.df < 30 and three.high - three.delta > Q.half_width(1 / three.se ** 2, d.rho)


def test_target_grid_is_the_cheapest_grid_that_reaches_the_information():
    d = Q.design(0.035)
    s2 = (0.0223 ** 2, 0.0884 ** 2, 0.1127 ** 2)
    t = Q.target_grid(s2, d, 3, 64, 400, cost_seed=1.0, cost_unit=0.0)
    assert t.feasible and Q.grid_variance(s2, t.seeds, t.units) <= 1 / d.info_target
    assert Q.grid_variance(s2, t.seeds - 1, 400) > 1 / d.info_target  # one seed fewer fails even with every document
    short = Q.target_grid(s2, d, 3, 64, 71)
    assert not short.feasible and short.units_floor > 71 and "σ²_doc" in short.reason


def test_plan_round_grows_seeds_within_the_budget_and_stops_with_a_reason():
    d = Q.design(0.035)
    s2 = (0.0223 ** 2, 0.0884 ** 2, 0.1127 ** 2)
    states = [Q.StrategyState("greedy", 3, 64, s2, False), Q.StrategyState("odm", 3, 64, s2, True)]
    plan = Q.plan_round(states, d, 3, 400, budget_left=100.0, cost_run=1.0)
    assert plan.seeds == {"greedy": 6} and plan.baseline_seeds == 6 and plan.cost == 6.0 and plan.units > 64
    tight = Q.plan_round(states, d, 3, 400, budget_left=2.0, cost_run=1.0)
    assert tight.seeds == {"greedy": 4} and tight.cost == 2.0
    spent = Q.plan_round(states, d, 3, 64, budget_left=1.0, cost_run=1.0)
    assert spent.stop.startswith("budget spent")
    done = Q.plan_round([Q.StrategyState("g", 3, 64, s2, True)], d, 3, 400, 10.0, 1.0)
    assert done.stop == "every strategy has a verdict"


def test_simulated_campaigns_keep_the_error_rate_and_reach_the_power():
    """Small version of benchmarks/bench_ablate.py: the demo's measured spreads, 0.5% of its loss."""
    d = Q.design(0.005 * DEMO.baseline_mean)
    null = Q.simulate_campaigns(DEMO, 0.0, d, 150, seed=1, max_units=400, budget_runs=200)
    assert null["p_better"] + null["p_worse"] <= 0.06
    alt = Q.simulate_campaigns(DEMO, -d.margin, d, 100, seed=2, max_units=400, budget_runs=200)
    assert alt["p_better"] >= 0.75 and alt["p_worse"] == 0


def test_fit_reads_the_spreads_from_a_data_roots_duckdb(tmp_path):
    import duckdb
    import polars as pl

    from pipeline.errors import StrataInputError

    rng = np.random.default_rng(5)
    true = Q.PairedModel(0.03, 0.06, 0.1, 7.0)
    n_s, n_u = 30, 60
    base = 7.0 + rng.normal(0, 0.2, n_u)  # per-document baseline level, shared by both arms
    rows = []
    for strategy, shift in (("random", 0.0), ("greedy", -0.02), ("odm", 0.0), ("cluster_sorted", 0.5)):
        b = rng.normal(0, true.sigma_doc, n_u) if strategy != "random" else np.zeros(n_u)
        for s in range(n_s):
            a = rng.normal(0, true.sigma_seed) if strategy != "random" else 0.0
            e = rng.normal(0, true.sigma_res, n_u) if strategy != "random" else np.zeros(n_u)
            c = 3.0 if strategy == "cluster_sorted" else 1.0  # the control's own spread is left out
            for u in range(n_u):
                rows += [{"strategy": strategy, "seed": s, "step": step, "tokens_seen": step, "unit": f"d{u}",
                          "loss": base[u] + shift + c * (a + b[u] + e[u]) + (1.0 if step == 0 else 0.0)} for step in (0, 30)]
    db = tmp_path / "strata.duckdb"
    with duckdb.connect(str(db)) as con:
        df = pl.DataFrame(rows)  # noqa: F841
        con.execute("CREATE TABLE heldout_curve AS SELECT * FROM df")
    model, fitted = Q.fit_paired_model(db)
    assert fitted["strategies"] == ["greedy", "odm"] and fitted["n_seeds"] == n_s
    assert model.sigma_seed == pytest.approx(0.03, rel=0.35) and model.sigma_doc == pytest.approx(0.06, rel=0.25)
    assert model.sigma_res == pytest.approx(0.1, rel=0.1) and model.baseline_mean == pytest.approx(base.mean(), abs=1e-9)
    with pytest.raises(StrataInputError, match="no paired runs"):
        Q.fit_paired_model(db, metric="heldout/all/doc_bits_per_byte")
    with pytest.raises(StrataInputError, match="no DuckDB"):
        Q.fit_paired_model(tmp_path / "missing.duckdb")
