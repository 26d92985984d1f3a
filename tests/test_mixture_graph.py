"""The TerRIFIC mixture stage materialized for real (``strata run`` with ``mixture.enabled``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import duckdb
import numpy as np
import polars as pl
import pytest
import yaml
from helpers import demo_slice

from pipeline.ordering.curriculum import load_curriculum

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def root(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("mixture")
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in demo_slice(300, stride=29)))
    cfg = {
        "data_root": str(tmp / "root"), "corpus": {"path": str(corpus), "source_field": "domain"},
        "heldout_fraction": 0.1, "vocab_size": 400, "k": 4, "seq_len": 64, "length_bins": 6,
        "strategies": ["random", "greedy", "greedy_mixture"], "batch_size": 8, "max_steps": 6, "warmup_steps": 1,
        "eval_limit": 2, "embed_max_tokens": 64, "embed_method": "shallow",
        "mixture": {"enabled": True, "iterations": 2, "curriculum_iterations": 1, "checkpoints": 2,
                    "projection_dim": 128, "examples_per_cluster": 3, "target_examples": 4},
    }
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "DAGSTER_HOME": ""}
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(tmp / "cfg.yaml")],
                          capture_output=True, text=True, env=env, cwd=request.config.rootpath, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return tmp / "root"


def test_weights_curriculum_and_ablation_rows(root):
    w = pl.read_parquet(root / "mixture" / "weights.parquet")
    assert w.columns == ["iteration", "cluster", "logit", "weight"]
    assert sorted(w["iteration"].unique().to_list()) == [0, 1, 2]
    sums = w.group_by("iteration").agg(pl.col("weight").sum())["weight"].to_numpy()
    assert np.allclose(sums, 1.0)
    # iteration 1 trains on iteration 0's update
    con = duckdb.connect(str(root / "strata.duckdb"), read_only=True)
    it = con.sql("SELECT iteration, cluster, logit, next_logit FROM mixture_iterations ORDER BY iteration, cluster").pl()
    assert np.allclose(it.filter(pl.col("iteration") == 1)["logit"], it.filter(pl.col("iteration") == 0)["next_logit"])
    cur = load_curriculum(root / "mixture" / "curriculum.yaml", 4)  # closes the loop: greedy_curriculum reads it
    assert cur.logits.shape == (2 + 2, 4)
    abl = con.sql("SELECT strategy, metric, mean FROM mixture_ablation").pl()
    assert set(abl["strategy"]) == {"random", "greedy", "greedy_mixture", "greedy_curriculum"}
    assert set(abl["metric"]) >= {"target_loss", "heldout_loss"} and abl["mean"].is_finite().all()
    real = con.sql("SELECT strategy, SUM(selected) AS n FROM mixture_realization GROUP BY strategy").pl()
    assert real["n"].to_list() == [6 * 8, 6 * 8]
    order = pl.read_parquet(root / "mixture" / "orderings" / "greedy_mixture.parquet")
    assert order.height == 48
    assert (root / "mixture" / "weights.png").stat().st_size > 10_000 and (root / "mixture" / "report.md").exists()


def test_greedy_mixture_ordering_reads_the_learned_weights_and_is_exported(root):
    """With the mixture stage on, orderings[greedy_mixture] schedules the whole corpus on the learned
    weights (learned before the orderings), and its export is that schedule, repetitions included."""
    from pipeline.packing.stored import sequence_store
    from pipeline.storage.layout import Layout, Store

    layout = Layout(root)
    ordering = Store(layout).ordering("greedy_mixture")
    w = pl.read_parquet(root / "mixture" / "weights.parquet")
    final = w.filter(pl.col("iteration") == w["iteration"].max()).sort("cluster")["weight"].to_numpy()
    np.testing.assert_allclose(ordering.target_share, final / final.sum())
    table = pl.read_parquet(layout.ordering_mixture("greedy_mixture"))
    assert (table["corpus_tokens"] == table["distinct_tokens"] + table["omitted_tokens"]).all()
    m = int(ordering.segments["sequence_id"].max()) + 1
    assert np.bincount(ordering.order, minlength=m).max() <= 4
    meta = json.loads((layout.export_dir("greedy_mixture", "numpy") / "meta.json").read_text())
    got = np.fromfile(layout.export_dir("greedy_mixture", "numpy") / "tokens.bin", dtype=meta["dtype"]).reshape(-1, meta["seq_len"])
    np.testing.assert_array_equal(got, sequence_store(layout).batch(ordering.order)[0])
