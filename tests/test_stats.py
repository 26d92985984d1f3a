"""Paired statistics of the ablation report: bootstrap interval, MDE, delta table, consumed diversity."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from pipeline.reports.consumed import consumed_diversity
from pipeline.reports.stats import Z_MDE, delta_table, minimum_detectable_effect, paired_bootstrap
from pipeline.reports.tables import ablation_table, higher_is_better, render_report, run_units


def test_bootstrap_of_a_constant_shift_is_that_shift_and_symmetric_noise_covers_zero():
    assert paired_bootstrap(np.full((3, 5), 0.25)) == pytest.approx((0.25, 0.25, 0.25))
    mean, lo, hi = paired_bootstrap(np.array([[1.0, -1.0], [-1.0, 1.0]]))
    assert mean == 0 and lo < 0 < hi


def test_single_unit_metrics_get_the_paired_t_interval_over_seeds():
    from pipeline.reports.stats import paired_t_interval

    mean, lo, hi = paired_t_interval(np.array([0.1, 0.3, 0.2]))  # sd 0.1, t_{0.975,2} = 4.3027
    assert mean == pytest.approx(0.2) and hi - mean == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-5)
    units = pl.DataFrame({"strategy": ["random", "x"] * 3, "seed": [0, 0, 1, 1, 2, 2], "metric": ["core"] * 6,
                          "unit": ["all"] * 6, "value": [0.1, 0.3, 0.2, 0.5, 0.1, 0.3]})
    r = delta_table(units).row(0, named=True)
    assert r["interval"] == "t" and r["delta"] == pytest.approx(0.2333333) and r["n_units"] == 1
    assert math.isnan(paired_t_interval(np.array([0.4]))[1])


def test_mde_is_hand_computed_from_the_per_seed_differences():
    d = np.array([[0.1, 0.1], [0.3, 0.3], [0.1, 0.3]])  # per-seed means 0.1, 0.3, 0.2: sd 0.1
    assert minimum_detectable_effect(d) == pytest.approx(Z_MDE * 0.1 / math.sqrt(3))
    assert Z_MDE == pytest.approx(2.8016, abs=1e-4)
    assert math.isnan(minimum_detectable_effect(d[:1]))


def _units(effect: dict[str, float], n_docs: int = 40, seeds=(0, 1, 2), noise: float = 0.3) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    doc = rng.normal(4.0, 1.0, n_docs)  # document difficulty, shared by all strategies
    rows = []
    for s in seeds:
        for strat, eff in effect.items():
            v = doc + eff + rng.normal(0, noise, n_docs)
            rows += [{"strategy": strat, "seed": s, "metric": "heldout_batch/loss", "unit": str(u), "value": float(x)} for u, x in enumerate(v)]
    return pl.DataFrame(rows)


def test_delta_table_pairs_by_seed_and_document():
    units = _units({"random": 0.0, "greedy": -0.5, "same": 0.0})
    d = {r["strategy"]: r for r in delta_table(units, higher_is_better=higher_is_better).iter_rows(named=True)}
    assert set(d) == {"greedy", "same"}
    g, s = d["greedy"], d["same"]
    assert g["delta"] == pytest.approx(-0.5, abs=0.1) and g["ci_high"] < 0 and g["significant"] and g["better"]
    assert s["ci_low"] < 0 < s["ci_high"] and not s["significant"] and not s["better"]
    assert g["n_seeds"] == 3 and g["n_units"] == 40
    # the pairing removes document difficulty (sd 1.0): the interval is far narrower than it
    assert g["ci_high"] - g["ci_low"] < 0.3
    # an accuracy that went up is "better"
    acc = units.with_columns(metric=pl.lit("dclm/core/acc"), value=-pl.col("value"))
    assert delta_table(acc, higher_is_better=higher_is_better).filter(pl.col("strategy") == "greedy")["better"].item()


def test_report_bolds_only_significant_differences():
    units = _units({"random": 0.0, "greedy": -0.5, "same": 0.0})
    table = ablation_table(units)
    deltas = delta_table(units)
    md = render_report(table, strategies=["random", "greedy", "same"], deltas=deltas)
    row = next(line for line in md.splitlines() if line.startswith("| heldout_batch/loss") and "[" in line)
    greedy_cell, same_cell = row.split("|")[2:4]
    assert greedy_cell.strip().startswith("**") and "**" not in same_cell
    assert sum(line.count("**") for line in md.splitlines() if line.startswith("|")) == 2  # the mean table bolds nothing


def test_run_units_takes_the_last_heldout_step_and_eval_rows():
    curve = pl.DataFrame({"strategy": ["r"] * 4, "seed": [0] * 4, "step": [0, 0, 5, 5], "tokens_seen": [0, 0, 9, 9],
                          "unit": ["a", "b", "a", "b"], "loss": [9.0, 9.0, 2.0, 4.0]})
    ev = pl.DataFrame({"strategy": ["r"], "seed": [0], "suite": ["dclm"], "task": ["core"], "metric": ["core_v2"], "value": [0.1]})
    u = run_units(curve, ev)
    assert u.filter(pl.col("metric") == "heldout_batch/loss")["value"].to_list() == [2.0, 4.0]
    t = ablation_table(u)
    assert dict(t.select("metric", "mean").iter_rows()) == {"dclm/core/core_v2": 0.1, "heldout_batch/loss": 3.0}


def test_consumed_diversity_hand_computed():
    # sequences 0: clusters {0, 1}; 1: {1}; 2: {2}. doc -> cluster: 0->0, 1->1, 2->1, 3->2
    seg = pl.DataFrame({"sequence_id": [0, 0, 1, 2], "doc_id": [0, 1, 2, 3], "n_tokens": [2, 2, 4, 4]})
    m = consumed_diversity(np.array([0, 1, 2, 2]), seg, np.array([0, 1, 1, 2]), batch_size=2)
    assert m["clusters_per_seq_mean"] == pytest.approx((2 + 1 + 1 + 1) / 4) and m["clusters_per_seq_min"] == 1
    assert m["clusters_per_batch_mean"] == pytest.approx(1.5) and m["clusters_per_batch_min"] == 1
    # global token shares 2/12, 6/12, 4/12; batch 0 (seqs 0, 1): 2/8, 6/8, 0 -> max dev 1/3;
    # batch 1 (seq 2 twice): 0, 0, 1 -> max dev 2/3
    assert m["batch_share_dev_max"] == pytest.approx(2 / 3) and m["batch_share_dev_mean"] == pytest.approx(0.5)
