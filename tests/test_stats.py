"""Paired statistics of the ablation report: bootstrap interval, MDE, delta table, consumed diversity."""

from __future__ import annotations

import math
from dataclasses import astuple

import numpy as np
import polars as pl
import pytest

from evals.suites import is_higher_better as higher_is_better
from pipeline.reports.stats import (
    POOLED,
    Z_MDE,
    VarianceComponents,
    control_verdict,
    delta_table,
    delta_variance,
    mde_by_checkpoint,
    minimum_detectable_effect,
    paired_bootstrap,
    plan_run,
    power_table,
    variance_components,
)
from pipeline.reports.tables import ablation_table, render_report, run_units
from pipeline.training.consumed import consumed_diversity


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


def test_mde_is_hand_computed_from_the_variance_components():
    # D[s, u] = a_s + b_u exactly: MS_E = 0, and the ANOVA components are the sample variances
    # var(a) = var(0, .2, .4) = 0.04 and var(b) = var(0, .1) = 0.005 (ddof 1)
    d = np.array([0.0, 0.2, 0.4])[:, None] + np.array([0.0, 0.1])[None, :]
    vc = variance_components(d)
    assert (vc.seed, vc.doc, vc.res) == pytest.approx((0.04, 0.005, 0.0), abs=1e-12)
    assert minimum_detectable_effect(d) == pytest.approx(Z_MDE * math.sqrt(0.04 / 3 + 0.005 / 2))
    assert Z_MDE == pytest.approx(2.8016, abs=1e-4)
    assert math.isnan(minimum_detectable_effect(d[:1]))
    # no document effect: per-seed means 0.1, 0.3, 0.2 (sd 0.1) -> the seeds-only MDE
    e = np.array([[0.1, 0.1], [0.3, 0.3], [0.1, 0.3]])
    assert minimum_detectable_effect(e) == pytest.approx(Z_MDE * 0.1 / math.sqrt(3))
    # one unit (an aggregate metric): sd of the per-seed values
    assert minimum_detectable_effect(np.array([[0.1], [0.3], [0.2]])) == pytest.approx(Z_MDE * 0.1 / math.sqrt(3))


def test_variance_components_are_unbiased_on_a_simulated_crossed_design():
    rng = np.random.default_rng(1)
    est = np.array([astuple(variance_components(rng.normal(0, 0.05, (4, 1)) + rng.normal(0, 0.1, (1, 30))
                                                + rng.normal(0, 0.2, (4, 30))))[:3] for _ in range(3000)])
    assert est.mean(0) == pytest.approx([0.05**2, 0.1**2, 0.2**2], rel=0.06)


def test_plan_run_hand_computed():
    # V* = (effect / Z)^2 = 1e-4. sigma2_seed 4e-4, sigma2_doc 6.4e-5, sigma2_res 6.4e-3, up to 64 documents:
    # seeds >= (4e-4 + 6.4e-3/64) / (1e-4 - 6.4e-5/64) = 5e-4 / 9.9e-5 = 5.05 -> 6;
    # documents >= (6.4e-5 + 6.4e-3/6) / (1e-4 - 4e-4/6) = 33.9 -> 34
    vc = VarianceComponents(4e-4, 6.4e-5, 6.4e-3, 3, 64)
    effect = Z_MDE * 0.01
    assert plan_run(vc, effect, 64) == (6, 34)
    assert delta_variance(vc, 6, 34) <= 1e-4 < min(delta_variance(vc, 6, 33), delta_variance(vc, 5, 64))
    assert plan_run(vc, -effect, 64) == (6, 34)  # the sign of the difference does not matter
    assert plan_run(VarianceComponents(4e-4, 0.0, 0.0, 3, 1), effect, 1) == (4, 1)  # aggregate: seeds only
    assert plan_run(VarianceComponents(1e-5, 0.0, 0.0, 3, 64), effect, 64) == (2, 1)  # never fewer than 2 seeds
    assert plan_run(VarianceComponents(1e-5, 0.0, 0.0, 3, 64), effect, 64, min_units=64) == (2, 64)  # nor documents than scored
    # the document term alone exceeds V*: no number of seeds helps with 64 documents, 128 would
    assert plan_run(VarianceComponents(4e-4, 6.4e-3, 0.0, 3, 64), effect, 64) == (None, None)
    assert plan_run(VarianceComponents(4e-4, 6.4e-3, 0.0, 3, 64), effect, 128)[0] == 8
    assert plan_run(VarianceComponents(math.nan, math.nan, math.nan, 1, 64), effect, 64) == (None, None)


def _grid(effects: dict[str, np.ndarray], n_docs: int, seeds=(0, 1, 2)) -> pl.DataFrame:
    """Units of heldout_batch/loss: random = 4 + document difficulty; strategy = random + effect[s, u]."""
    doc = np.linspace(3.0, 5.0, n_docs)
    rows = []
    for si, s in enumerate(seeds):
        for strat, eff in {"random": np.zeros((len(seeds), n_docs)), **effects}.items():
            rows += [{"strategy": strat, "seed": s, "metric": "heldout_batch/loss", "unit": f"d{u:02d}",
                      "value": float(doc[u] + eff[si, u])} for u in range(n_docs)]
    return pl.DataFrame(rows)


def test_power_table_pools_the_compared_orderings_and_plans_the_next_run():
    a, b = np.array([0.0, 0.02, 0.04]), np.array([0.0, 0.1])  # greedy: D = a_s + b_u, var(a) = 4e-4, var(b) = 0.005
    rng = np.random.default_rng(0)
    units = _grid({"greedy": a[:, None] + b[None, :] - 0.02, "cluster_sorted": 1.0 + rng.normal(0, 1.0, (3, 2))}, 2)
    p = power_table(units, control="cluster_sorted", max_units=2, tokens_per_run=1000)
    rows = {r["strategy"]: r for r in p.iter_rows(named=True)}
    assert set(rows) == {"greedy", "cluster_sorted", POOLED}
    g, pooled = rows["greedy"], rows[POOLED]
    assert g["baseline_mean"] == pytest.approx(4.0) and g["delta"] == pytest.approx(0.05) and g["delta_rel"] == pytest.approx(0.0125)
    assert (g["sigma_seed"], g["sigma_doc"], g["sigma_res"]) == pytest.approx((0.02, math.sqrt(0.005), 0.0), abs=1e-9)
    assert g["mde"] == pytest.approx(Z_MDE * math.sqrt(4e-4 / 3 + 0.005 / 2)) and g["mde_rel"] == pytest.approx(g["mde"] / 4)
    # the pooled row is greedy's components alone (the control is left out) with the 0.5% target
    assert (pooled["sigma_seed"], pooled["sigma_doc"]) == pytest.approx((g["sigma_seed"], g["sigma_doc"]))
    assert pooled["target"] == pytest.approx(0.02) and pooled["target_rel"] == pytest.approx(0.005)
    vc = VarianceComponents(4e-4, 0.005, 0.0, 3, 2)
    assert (pooled["seeds_needed"], pooled["units_needed"]) == plan_run(vc, 0.02, 2) == (None, None)  # doc term 0.0025 > V*
    assert (g["seeds_needed"], g["units_needed"]) == plan_run(vc, 0.05, 2) == (None, None)
    wide = power_table(units, control="cluster_sorted", max_units=400, tokens_per_run=1000)
    pooled = wide.filter(pl.col("strategy") == POOLED).row(0, named=True)
    n, m = plan_run(vc, 0.02, 400)  # V* = (0.02 / Z)^2 = 5.10e-5: seeds >= 4e-4 / (V* - 0.005 / 400) = 10.4
    assert n == 11 and (pooled["seeds_needed"], pooled["units_needed"]) == (n, m) and pooled["train_tokens"] == n * 1000
    assert delta_variance(vc, n, m) <= (0.02 / Z_MDE) ** 2 < delta_variance(vc, n - 1, 400)
    assert power_table(units.filter(pl.col("strategy") != "random")).is_empty()


def test_mde_by_checkpoint_scores_each_step_after_the_first():
    rows = []
    for step, shift in ((0, 0.0), (10, 0.3)):
        for s in (0, 1):
            for strat, eff in (("random", 0.0), ("x", shift + 0.1 * s)):
                rows += [{"strategy": strat, "seed": s, "step": step, "tokens_seen": step * 100, "unit": str(u),
                          "loss": 5.0 - step / 10 + u + eff} for u in range(3)]
    c = mde_by_checkpoint(pl.DataFrame(rows))
    assert c["step"].to_list() == [10] and c["tokens_seen"].to_list() == [1000]
    r = c.row(0, named=True)
    assert r["delta"] == pytest.approx(0.35) and r["baseline_mean"] == pytest.approx(5.0)
    # D = 0.3 + 0.1 s: sigma2_seed = var(0.3, 0.4) = 0.005, no document or residual term
    assert r["mde"] == pytest.approx(Z_MDE * math.sqrt(0.005 / 2))


def _report(control_effect: float | None) -> str:
    effects = {"greedy": np.full((3, 40), -0.5)}
    if control_effect is not None:
        effects["cluster_sorted"] = np.full((3, 40), control_effect)
    units = _units({"random": 0.0, **{k: float(v[0, 0]) for k, v in effects.items()}})
    deltas = delta_table(units)
    order = ["random", "greedy", *(["cluster_sorted"] if control_effect is not None else [])]
    power = power_table(units, control="cluster_sorted", max_units=500, tokens_per_run=122_880)
    return render_report(ablation_table(units), strategies=order, deltas=deltas, power=power)


def _delta_row(md: str) -> str:
    return next(line for line in md.splitlines() if line.startswith("| heldout_batch/loss") and "[" in line)


def test_report_opens_with_the_detected_control_then_the_power_statement():
    md = _report(+1.0)
    lines = md.splitlines()
    assert lines[0] == "# Strata ablation report"
    first = lines[2]
    assert first.startswith("The positive control `cluster_sorted`") and "heldout_batch/loss" in first
    assert "the interval excludes zero, so the harness detected it." in first and first.count(". ") == 0
    assert lines[4].startswith("**Power.** To detect a Δ of 0.50% of `random`'s `heldout_batch/loss`")
    assert "seeds ×" in lines[4] and "held-out documents**" in lines[4] and "its intervals resolve `cluster_sorted`, `greedy`" in lines[4]
    assert "**" in _delta_row(md).split("|")[2]  # greedy's significant difference is bolded


def test_the_claims_table_follows_the_control_sentence():
    units = _units({"random": 0.0, "greedy": -0.5, "cluster_sorted": 1.0})
    claims = "## The papers' claims\n\n| paper | claim |\n|---|---|\n| Don't Shuffle, Optimize | constant |"
    md = render_report(ablation_table(units), deltas=delta_table(units), power=power_table(units, max_units=2), claims=claims)
    lines = md.splitlines()
    assert lines[2].startswith("The positive control `cluster_sorted`") and lines[4] == "## The papers' claims"
    assert md.index("| Don't Shuffle, Optimize | constant |") < md.index("**Power.**") < md.index("## Difference to")


def test_an_undetected_control_says_the_run_has_no_power_and_unbolds_everything():
    md = _report(0.0)
    first = md.splitlines()[2]
    assert "the interval includes zero, so the harness did not detect it" in first
    assert "this run has no power to rank the other orderings" in first
    assert "none of today's differences can be relied on" in md
    row = _delta_row(md)
    assert "**" not in row and delta_table(_units({"random": 0.0, "greedy": -0.5}))["significant"].all()  # greedy is still significant
    assert not any("**" in line for line in md.splitlines() if line.startswith("|"))


def test_a_control_better_than_random_is_not_a_detection():
    md = _report(-1.0)
    assert "came out *better* than random" in md.splitlines()[2] and "no power to rank" in md.splitlines()[2]
    assert "**" not in _delta_row(md)
    v = control_verdict(delta_table(_units({"random": 0.0, "cluster_sorted": -1.0})), "cluster_sorted")
    assert v.status == "reversed" and not v.detected


def test_a_report_without_the_control_says_none_was_run():
    md = _report(None)
    assert md.splitlines()[2].startswith("No positive control was run: `cluster_sorted`")
    assert "**" in _delta_row(md).split("|")[2]  # bolding follows the intervals alone
    v = control_verdict(delta_table(_units({"random": 0.0, "greedy": -0.5})), "cluster_sorted")
    assert v.status == "absent" and math.isnan(v.delta)


def _units(effect: dict[str, float], n_docs: int = 40, seeds=(0, 1, 2), noise: float = 0.3) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    doc = rng.normal(4.0, 1.0, n_docs)  # document difficulty, shared by all strategies
    rows = []
    for s in seeds:
        for strat, eff in effect.items():
            v = doc + eff + rng.normal(0, noise, n_docs)
            rows += [{"strategy": strat, "seed": s, "metric": "heldout_batch/loss", "unit": str(u), "value": float(x)} for u,
                     x in enumerate(v)]
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


def test_consumed_diversity_sums_in_batch_order():
    """The means and stds are numpy's over the batches in order, to the bit (group_by's row order is
    arbitrary, and a sum in another order differs in the last bit)."""
    rng = np.random.default_rng(0)
    seg = pl.DataFrame({"sequence_id": np.repeat(np.arange(400), 3), "doc_id": np.arange(1200),
                        "n_tokens": rng.integers(1, 50, 1200)})
    cluster = rng.integers(0, 37, 1200)
    stream = rng.permutation(400)
    m = consumed_diversity(stream, seg, cluster, batch_size=3)
    per = [len({int(c) for q in stream[i:i + 3] for c in cluster[q * 3:q * 3 + 3]}) for i in range(0, 400, 3)]
    assert m["clusters_per_batch_std"] == float(np.asarray(per, dtype=np.float64).std())
    assert m["clusters_per_batch_mean"] == float(np.asarray(per, dtype=np.float64).mean())
    assert all(consumed_diversity(stream, seg, cluster, batch_size=3) == m for _ in range(5))


def test_unreachable_targets_name_the_documents_they_need():
    a, b = np.array([0.0, 0.02, 0.04]), np.array([0.0, 0.1])
    units = _grid({"greedy": a[:, None] + b[None, :] - 0.02}, 2)
    p = power_table(units, max_units=2).filter(pl.col("strategy") == POOLED).row(0, named=True)
    # V* = (0.02 / Z)^2 = 5.096e-5; sigma2_doc = 0.005 -> sigma2_doc / M < V* from M = floor(98.1) + 1 = 99
    assert p["seeds_needed"] is None and p["units_floor"] == 99 and p["max_units"] == 2
    md = render_report(ablation_table(units), deltas=delta_table(units), power=power_table(units, max_units=2))
    assert "no run of at most 1,000 seeds × 2 held-out documents (all there are) can" in md
    assert "needs ≥ 99 held-out documents" in md and "none with the 2 docs there are (≥ 99 docs)" in md


def test_one_seed_has_no_power_statement_and_the_figure_renders(tmp_path):
    from pipeline.reports.power_plots import plot_power

    one = _units({"random": 0.0, "greedy": -0.5, "cluster_sorted": 1.0}, seeds=(0,))
    p = power_table(one, control="cluster_sorted")
    assert POOLED not in set(p["strategy"]) and p["seeds_needed"].is_null().all() and p["mde"].is_nan().all()
    md = render_report(ablation_table(one), deltas=delta_table(one), power=p)
    assert "**Power:** not computed" in md
    units = _units({"random": 0.0, "greedy": -0.05, "cluster_sorted": 1.0})
    curve = units.select("strategy", "seed", step=pl.lit(10), tokens_seen=pl.lit(1000), unit="unit", loss="value")
    out = plot_power(power_table(units, control="cluster_sorted", max_units=200), mde_by_checkpoint(curve), tmp_path / "power.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


def test_ablation_table_has_the_same_bits_whatever_the_row_order():
    """DuckDB returns a table's rows in no set order: the means and stds must not depend on it."""
    rng = np.random.default_rng(0)
    n = 400
    units = pl.DataFrame({"strategy": rng.choice(["a", "b"], n), "seed": rng.integers(0, 5, n), "metric": rng.choice(["m1", "m2"], n),
                          "unit": [str(i) for i in range(n)], "value": rng.random(n) * 1e3})
    want = ablation_table(units)
    for seed in range(5):
        assert ablation_table(units.sample(fraction=1.0, shuffle=True, seed=seed)).equals(want)
