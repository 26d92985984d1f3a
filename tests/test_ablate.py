"""``strata ablate``: budget parsing and bad input (unit), and one small campaign end to end
(integration: a tiny data root, a pilot of 2 seeds, rounds until the token budget is spent, then the
same command again, which finds the finished campaign and trains nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
import yaml
from helpers import demo_slice, small_graph_config

from pipeline.errors import StrataInputError
from pipeline.reports.campaign import HELDOUT

REPO = Path(__file__).resolve().parents[1]


def test_budget_parsing_and_seed_lists():
    from pipeline.reports.campaign import parse_budget, seed_list

    assert parse_budget("60m") == (3600.0, None) and parse_budget("90s") == (90.0, None) and parse_budget("2h") == (7200.0, None)
    assert parse_budget("5M tokens") == (None, 5_000_000) and parse_budget("16k tokens") == (None, 16_000)
    for bad in ("soon", "-5m", "0 tokens"):
        with pytest.raises(StrataInputError, match="cannot read budget"):
            parse_budget(bad)
    assert seed_list([0, 1, 2], 5) == [0, 1, 2, 3, 4] and seed_list([7, 3], 3) == [7, 3, 8]


def test_bad_campaigns_are_input_errors():
    from pipeline.cli.ablate import check_campaign
    from pipeline.reports.campaign import CampaignSpec

    with pytest.raises(StrataInputError, match="unknown strategy 'gready'"):
        check_campaign(CampaignSpec(("gready",), budget_s=60))
    with pytest.raises(StrataInputError, match="other than the baseline"):
        check_campaign(CampaignSpec(("random",), budget_s=60))
    with pytest.raises(StrataInputError, match="one budget"):
        check_campaign(CampaignSpec(("greedy",)))
    with pytest.raises(StrataInputError, match="fraction"):
        check_campaign(CampaignSpec(("greedy",), effect=5.0, budget_s=60))


def _units(deltas: dict[str, float], seeds: int, docs: int, noise: float) -> pl.DataFrame:
    """Per-document losses of ``random`` and each strategy of ``deltas`` (its mean difference to random), seeded noise."""
    rng = np.random.default_rng(0)
    doc = rng.normal(3.0, 0.3, docs)
    rows = []
    for strategy, delta in {"random": 0.0, **deltas}.items():
        for seed in range(seeds):
            values = doc + delta + rng.normal(0, noise) + rng.normal(0, noise, docs)
            rows += [{"strategy": strategy, "seed": seed, "metric": HELDOUT, "unit": f"d{u}", "value": float(v)}
                     for u, v in enumerate(values)]
    return pl.DataFrame(rows)


def test_a_round_is_decided_by_a_pure_function():
    """The campaign's decisions need no Dagster: the pilot's state, the runs a round needs, the
    verdicts and the next round from the round's measurements, and the state a resumed campaign
    reads back from the rows it wrote."""
    from pipeline.reports.campaign import CampaignSpec, Measured, decide_round, round_seeds, start_state

    spec = CampaignSpec(("greedy", "stratified"), budget_s=3600.0, pilot_seeds=3)
    started = datetime(2026, 1, 1)
    pilot = start_state(spec, pl.DataFrame(), 64, started)
    assert (pilot.round, pilot.margin, pilot.resolved, pilot.finished) == (0, None, {}, "")
    assert pilot.plan == {"seeds": {"greedy": 3, "stratified": 3}, "baseline_seeds": 3, "units": 64}
    assert round_seeds(spec, pilot.plan, [5, 1], pl.DataFrame()) == {"greedy": [5, 1, 6], "stratified": [5, 1, 6], "random": [5, 1, 6]}

    # greedy clearly better; stratified within noise of random: undecided, so the planner asks for more
    units = _units({"greedy": -0.5, "stratified": 0.004}, seeds=3, docs=64, noise=0.02)
    measured = Measured(units, available=400, baseline_seeds=3, runs_trained=9, scoring_s=2.0, spent_s=600.0, spent_tokens=0,
                        run_cost=60.0, unit_cost=0.01, left=3000.0)
    d = decide_round(spec, spec.key(), pilot, measured, datetime(2026, 1, 1, 1), higher_is_better=False)  # a loss: lower is better
    verdicts = dict(zip(d.table["strategy"], d.table["verdict"]))
    assert verdicts == {"greedy": "better", "stratified": "unresolved"}
    assert d.table["margin"].to_list() == [pytest.approx(0.005 * units.filter(pl.col("strategy") == "random")["value"].mean())] * 2
    assert d.table["scoring_s"].to_list() == [2.0, 0.0] and not d.stop
    assert set(d.next.plan["seeds"]) == {"stratified"} and d.next.plan["seeds"]["stratified"] > 3
    assert (d.next.round, d.next.scoring_s, d.next.resolved) == (1, 2.0, {"greedy": "better"})

    # resumed from its rows: the same next round, margin and verdicts
    again = start_state(spec, d.table, 64, datetime(2027, 1, 1))
    assert (again.round, again.started, again.margin, again.resolved) == (1, started, d.next.margin, d.next.resolved)
    assert {k: again.plan[k] for k in d.next.plan} == d.next.plan

    # a verdict stays once reached, even where the next round's data would not reach it; with none left the campaign stops
    done = decide_round(spec, spec.key(), replace(d.next, resolved={"greedy": "better", "stratified": "equivalent"}),
                        replace(measured, units=_units({"greedy": 0.0, "stratified": 0.0}, seeds=3, docs=64, noise=0.02)), started,
                        higher_is_better=False)
    assert dict(zip(done.table["strategy"], done.table["verdict"])) == {"greedy": "better", "stratified": "equivalent"}
    assert done.stop and done.plan.stop == "every strategy has a verdict"


def _ablate(cfg_path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "assets.cli", "ablate", "--config", str(cfg_path), *extra],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600, check=False)


@pytest.mark.integration
def test_ablate_campaign_end_to_end_and_resumed(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in demo_slice(300, stride=7)))
    cfg = {**small_graph_config(corpus), "data_root": str(tmp_path / "root")}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    args = ("--strategies", "greedy", "--budget", "16k tokens", "--pilot-seeds", "2")
    first = _ablate(path, *args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "round 0: run 1/4" in first.stdout and "stop:" in first.stdout
    db = tmp_path / "root" / "strata.duckdb"
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.sql("SELECT * FROM ablation_campaign ORDER BY round").pl()
        units = con.sql("SELECT * FROM ablation_units").pl()
        curve = con.sql("SELECT * FROM heldout_curve").pl()
        trained = con.execute("SELECT count(*) FROM lineage WHERE asset = 'training_runs'").fetchall()[0][0]
    assert rows["round"].to_list() == list(range(rows.height)) and rows.height >= 2  # the pilot and at least one round
    assert rows["n_seeds"][0] == 2 and rows["n_seeds"][-1] > 2 and rows["n_units"][-1] >= cfg["heldout_docs"]
    assert rows["spent_tokens"][-1] <= 16_000 and rows["spent_tokens"][-1] == 2_048 * trained
    assert set(rows["verdict"]) <= {"better", "worse", "equivalent", "unresolved"}
    assert (rows["ci_low"] <= rows["delta"]).all() and (rows["delta"] <= rows["ci_high"]).all()
    # the campaign's own scoring of each saved model agrees with the loss training recorded on the same documents
    last = curve.filter(pl.col("step") == pl.col("step").max()).select("strategy", "seed", "unit", "loss")
    both = last.join(units, on=["strategy", "seed", "unit"])
    assert both.height == last.height and (both["loss"] - both["value"]).abs().max() < 1e-4
    assert (tmp_path / "root" / "report" / "ablation_campaign.png").stat().st_size > 0
    assert "Ablation campaign" in (tmp_path / "root" / "report" / "ablate.md").read_text()

    again = _ablate(path, *args)  # the finished campaign is found, nothing is trained again
    assert again.returncode == 0 and "already finished" in again.stdout, again.stderr[-3000:]
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM lineage WHERE asset = 'training_runs'").fetchall()[0][0] == trained

    # the report shows the campaign (its section and figure) once ablation_report is materialized
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(REPO)}
    report = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(tmp_path / "root" / "ablate_config.yaml"),
                             "--data-root", str(tmp_path / "root"), "--select", "key:ablation_report"],
                            capture_output=True, text=True, env=env, cwd=REPO, timeout=600, check=False)
    assert report.returncode == 0, report.stderr[-3000:]
    text = (tmp_path / "root" / "report.md").read_text()
    assert "## Ablation campaign" in text and "report/ablation_campaign.png" in text

    bad = _ablate(path, "--strategies", "gready", "--budget", "1m")
    assert bad.returncode == 2 and "unknown strategy 'gready'" in bad.stderr


def test_the_ablate_job_is_in_the_definitions_and_the_demo_sentence_follows_the_planner():
    from assets.definitions import build_definitions
    from pipeline.reports import sequential as Q
    from pipeline.reports.campaign import demo_sentence
    from pipeline.reports.stats import POWER_SCHEMA

    job = build_definitions(None, None).resolve_job_def("ablate")
    fields = job.run_config_schema.config_type.fields["ops"].config_type.fields["ablation_campaign_op"].config_type.fields
    assert {"strategies", "budget", "baseline", "metric", "effect", "pilot_seeds"} <= set(fields["config"].config_type.fields)

    def power(max_units: int):
        row = {k: None for k in POWER_SCHEMA} | {"metric": "heldout_batch/loss", "strategy": "pooled", "baseline": "random",
                                                 "sigma_seed": 0.0223, "sigma_doc": 0.0884, "sigma_res": 0.1127, "n_seeds": 3,
                                                 "n_units": 64, "target": 0.0349, "target_rel": 0.005, "max_units": max_units}
        return pl.DataFrame([row], schema=POWER_SCHEMA)

    t = Q.target_grid((0.0223 ** 2, 0.0884 ** 2, 0.1127 ** 2), Q.design(0.0349), 3, 64, 400)
    s = demo_sentence(power(400), 122_880, 50.0)
    assert f"{t.seeds} seeds × {t.units} held-out documents" in s and f"--budget {-(-(t.seeds - 3) * 2 * 50 // 60)}m" in s
    assert ("cannot resolve ±0.5%" in demo_sentence(power(71), 122_880, 50.0)
            and "raise heldout_fraction" in demo_sentence(power(71), 0, None))


def test_the_ablate_job_runs_the_cli_and_its_bad_input_fails_the_run(tmp_path):
    """The job's op runs ``strata ablate`` with the Launchpad's fields; a bad budget exits 2 there
    with the CLI's clear error (which the op raises as the run's failure)."""
    import subprocess

    from assets.ablate_job import AblateJobConfig, ablate_command

    cfg = AblateJobConfig(strategies=["greedy", "stratified"], budget="ten minutes", pilot_seeds=2)
    cmd = ablate_command(cfg, None, str(tmp_path / "root"))
    assert cmd[cmd.index("--strategies") + 1: cmd.index("--budget")] == ["greedy", "stratified"]
    assert cmd[cmd.index("--pilot-seeds") + 1] == "2" and cmd[-2:] == ["--data-root", str(tmp_path / "root")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "budget" in proc.stderr and "Traceback" not in proc.stderr
