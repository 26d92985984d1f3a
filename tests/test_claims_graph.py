"""`strata run` then `strata claims --full` on a slice of the demo corpus: every claim row, figure and table."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml
from helpers import demo_slice

from pipeline.claims.measure import VERDICTS

pytestmark = pytest.mark.integration

KEYS = {
    "dso.prefix_error.clusters", "dso.prefix_error.length_bins", "dso.stationarity", "dso.worst_vs_best_batch.clusters",
    "dso.worst_vs_best_batch.length_bins", "dso.stable_rank.attention.25%", "dso.stable_rank.mlp.25%",
    "dso.stable_rank.attention.100%", "dso.stable_rank.mlp.100%", "dot.diversity.stratified_vs_original",
    "dot.diversity.stratified_vs_rivals", "terrific.fidelity.greedy_vs_random", "dot.epoch_boundary.topical.grad_norm",
    "dot.epoch_boundary.topical_minus_stratified.grad_norm", "dot.epoch_boundary.topical.loss",
    "dot.epoch_boundary.topical_minus_stratified.loss", "terrific.fidelity.greedy_range",
    "terrific.min_stable_rank.attention.25%", "terrific.min_stable_rank.mlp.25%", "terrific.min_stable_rank.attention.100%",
    "terrific.min_stable_rank.mlp.100%",
    *(f"packing.paper.{k}.{a}_vs_{b}" for k in ("final", "rank")
      for a, b in (("padding-x1", "concat-x1"), ("concat-x1", "concat-x0.5"), ("concat-x1", "concat-x2"))),
}


def _strata(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": ""}
    return subprocess.run([sys.executable, "-m", "assets.cli", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=900)


def test_strata_claims_full(tmp_path, request):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in demo_slice(240)))
    cfg = {"data_root": str(tmp_path / "root"), "corpus": {"path": str(corpus), "source_field": "domain"},
           "heldout_fraction": 0.1, "vocab_size": 400, "k": 4, "seq_len": 64, "length_bins": 4, "embed_max_tokens": 32,
           "strategies": ["random", "greedy"], "seeds": [0, 1], "batch_size": 4, "max_steps": 4, "warmup_steps": 1,
           "eval_limit": 1, "heldout_docs": 8, "fidelity_chunks": 4, "fidelity_sequences_per_chunk": 4, "probe_fractions": [0.25, 1.0],
           "claims": {"k": 5, "shuffles": 4, "probe_batches": 3, "seeds": [0, 1], "epochs": 2, "epoch_sequences": 16,
                      "packing_sequences": 128}, "bootstrap_samples": 200}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    root = request.config.rootpath
    run = _strata(["run", "--config", str(path)], root)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    claims = _strata(["claims", "--full", "--config", str(path), "--json"], root)
    assert claims.returncode == 0, claims.stdout[-3000:] + claims.stderr[-5000:]
    rows = json.loads(claims.stdout)
    assert {r["key"] for r in rows} == KEYS
    for r in rows:
        assert not Path(r["figure"]).is_absolute()  # relative to the data root: the same bytes wherever it lies
        assert r["verdict"] in VERDICTS and r["paper_figure"] and r["interval"]
        assert (Path(cfg["data_root"]) / r["figure"]).stat().st_size > 5_000
        assert math.isfinite(r["value"]) and r["ci_low"] <= r["ci_high"], r
    db = Path(cfg["data_root"]) / "strata.duckdb"
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM claims").fetchone()[0] == len(KEYS)
        assert con.execute("SELECT count(*) FROM claims_not_measured").fetchone()[0] == 0
        assert con.execute("SELECT count(DISTINCT strategy) FROM claims_diversity").fetchone()[0] == 6
        assert con.execute("SELECT count(DISTINCT experiment || arm || seed) FROM claim_runs_arms").fetchone()[0] == 2 * 2 + 4 * 2
        probes = con.execute("SELECT strategy, max(probe) + 1 FROM stable_rank GROUP BY 1 ORDER BY 1").fetchall()
    assert probes == [("greedy", 3), ("random", 3)]
    report = (Path(cfg["data_root"]) / "report.md").read_text()
    assert "## Claims of the papers, reproduced on this corpus" in report and "(report/claims/claim_epoch_boundary.png)" in report
    again = _strata(["claims", "--config", str(path)], root)  # no --full: the runs are kept, the table re-rendered
    assert again.returncode == 0 and "Claims of the papers" in again.stdout, again.stderr[-3000:]
