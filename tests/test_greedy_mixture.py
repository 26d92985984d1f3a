"""``greedy_mixture``: a learned mixture realized over the corpus as a schedule (repeats, omissions),
its accounting and checks, and diagnostics measured against the mixture."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from pipeline.errors import StrataInputError
from pipeline.ordering import strategies
from pipeline.ordering.engine import OrderParams, run_strategy
from pipeline.ordering.schedule import (
    accounting,
    cluster_tokens,
    l1_distance,
    load_weights,
    repeat_counts,
    schedule_problems,
    sequence_rates,
)
from pipeline.packing.pack import pack_concat
from pipeline.reports import diagnostics as D

K, L = 6, 128


def corpus(seed: int = 0, n: int = 1200, k: int = K):
    """Documents of random clusters and lengths, packed by concat into L-token sequences (mostly mixed)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(10, 300, n)
    docs = pl.DataFrame({"doc_id": np.arange(n), "cluster": rng.integers(0, k, n), "n_tokens": lengths})
    return docs, pack_concat(np.arange(n), lengths, L).segments


def weights_file(tmp_path, weights: dict, name: str = "w.json"):
    path = tmp_path / name
    path.write_text(json.dumps({str(k): v for k, v in weights.items()}))
    return str(path)


def schedule(docs, seg, params, seed=0):
    order = run_strategy("greedy_mixture", docs, seg, L, params, seed).order["sequence_id"].to_numpy()
    target = load_weights(params.mixture_weights_file, K)
    return order, accounting(order, cluster_tokens(seg, docs["cluster"].to_numpy()), target)


def test_weights_files(tmp_path):
    w = load_weights(weights_file(tmp_path, {0: 1, 2: 3}), 4)
    np.testing.assert_allclose(w, [0.25, 0, 0.75, 0])
    (tmp_path / "w.yaml").write_text("0: 2\n3: 2\n")
    np.testing.assert_allclose(load_weights(tmp_path / "w.yaml", 4), [0.5, 0, 0, 0.5])
    pl.DataFrame({"iteration": [0, 0, 1, 1], "cluster": [0, 1, 0, 1], "weight": [0.5, 0.5, 0.2, 0.8]}).write_parquet(tmp_path / "w.parquet")
    np.testing.assert_allclose(load_weights(tmp_path / "w.parquet", 2), [0.2, 0.8])  # the last iteration
    for bad, match in (({9: 1.0}, "outside 0..3"), ({0: -1.0}, "weight -1"), ({0: 0.0}, "every weight is 0")):
        with pytest.raises(StrataInputError, match=match) as err:
            load_weights(weights_file(tmp_path, bad, "bad.json"), 4)
        assert "bad.json" in str(err.value)
    with pytest.raises(StrataInputError, match="does not exist"):
        load_weights(tmp_path / "missing.json", 4)


def test_feasible_mixture_is_realized_within_caps(tmp_path):
    docs, seg = corpus()
    want = {0: 0.05, 1: 0.35, 2: 0.1, 3: 0.3, 4: 0.15, 5: 0.05}
    params = OrderParams(length_bins=8, mixture_weights_file=weights_file(tmp_path, want), max_sequence_copies=3)
    order, table = schedule(docs, seg, params)
    m = int(seg["sequence_id"].max()) + 1
    corpus_share = table["corpus_tokens"].to_numpy() / table["corpus_tokens"].sum()
    assert np.abs(corpus_share - list(want.values())).sum() > 0.3  # the corpus is far from the mixture
    assert l1_distance(table) < 0.02  # the schedule is not
    assert np.bincount(order, minlength=m).max() <= 3
    assert table["repeated_tokens"].sum() > 0 and table["omitted_tokens"].sum() > 0  # it repeats some sequences and leaves out others
    # the budget: the corpus's tokens
    assert abs(int(table["scheduled_tokens"].sum()) - int(seg["n_tokens"].sum())) < 0.02 * int(seg["n_tokens"].sum())
    assert schedule_problems(order, m, table, 3) == []
    again, _ = schedule(docs, seg, params)
    np.testing.assert_array_equal(order, again)  # same seed, same schedule


def test_budget_sets_the_schedule_size(tmp_path):
    docs, seg = corpus(1)
    weights = weights_file(tmp_path, {j: 1.0 for j in range(K)})
    params = OrderParams(length_bins=8, mixture_weights_file=weights, mixture_budget_tokens=40_000)
    _, table = schedule(docs, seg, params)
    assert abs(int(table["scheduled_tokens"].sum()) - 40_000) < 2 * L
    assert l1_distance(table) < 0.05  # a small budget: the rounding of ~300 sequences shows (mixture_tolerance)


def test_infeasible_mixture_gets_as_close_as_it_can_and_says_how_close(tmp_path):
    docs, seg = corpus(2)
    params = OrderParams(length_bins=8, mixture_weights_file=weights_file(tmp_path, {0: 0.9, 1: 0.1}), max_sequence_copies=1)
    order, table = schedule(docs, seg, params)
    target = table["target_share"].to_numpy()
    corpus_share = table["corpus_tokens"].to_numpy() / table["corpus_tokens"].sum()
    assert np.bincount(order).max() == 1
    # cluster 0 holds a sixth of the corpus: at one copy and the full budget the mixture is out of reach,
    # so the schedule shrinks its budget and keeps the mixture
    assert l1_distance(table) < 0.5 * np.abs(corpus_share - target).sum()
    assert table["scheduled_tokens"].sum() < table["corpus_tokens"].sum()


def test_rates_solve_the_cluster_equations():
    docs, seg = corpus(3)
    from pipeline.ordering.features import sequence_features

    d = seg["doc_id"].to_numpy()
    f = sequence_features(seg["sequence_id"].to_numpy(), docs["cluster"].to_numpy()[d], docs["n_tokens"].to_numpy()[d],
                          seg["n_tokens"].to_numpy(), 8, d)
    w = np.array([0.3, 0.3, 0.1, 0.1, 0.1, 0.1])
    budget = float(f.lengths.sum())
    r = sequence_rates(f, w, budget, 4)
    assert r.min() >= 0 and r.max() <= 4
    rows = np.repeat(np.arange(f.n_sequences), np.diff(f.clusters.indptr))
    got = np.bincount(f.clusters.indices, weights=f.clusters.data * r[rows], minlength=K)
    np.testing.assert_allclose(got, w * budget, rtol=1e-6)  # the continuous rates meet the targets exactly
    counts = repeat_counts(f, w, budget, 4, seed=0)
    assert np.abs(counts - r).max() < 1  # rounding moves no sequence by a whole copy


def test_problems_are_found():
    seg_tokens = pl.DataFrame({"sequence_id": [0, 0, 1, 2], "cluster": [0, 1, 1, 0], "tokens": [3, 5, 8, 8]})
    target = np.array([0.5, 0.5])
    table = accounting(np.array([0, 0, 1]), seg_tokens, target)
    assert table["omitted_tokens"].to_list() == [8, 0] and table["repeated_tokens"].to_list() == [3, 5]
    assert table["scheduled_tokens"].to_list() == [6, 18] and table["max_copies"].to_list() == [2, 2]
    assert schedule_problems(np.array([0, 0, 1]), 3, table, 2) == []
    assert "more than max_sequence_copies=1" in schedule_problems(np.array([0, 0, 1]), 3, table, 1)[0]
    assert "outside 0..2" in schedule_problems(np.array([0, 5]), 3, table, 2)[0]
    lost = table.with_columns(omitted_tokens=pl.col("omitted_tokens") + 1)
    assert schedule_problems(np.array([0, 0, 1]), 3, lost, 2) == ["corpus tokens != distinct + omitted tokens for some cluster"]


def test_diagnostics_measure_against_the_mixture(tmp_path):
    docs, seg = corpus(4)
    params = OrderParams(length_bins=8, mixture_weights_file=weights_file(tmp_path, {0: 0.5, 1: 0.3, 2: 0.2}))
    order, table = schedule(docs, seg, params)
    cluster, length = docs["cluster"].to_numpy(), docs["n_tokens"].to_numpy() + 1
    target = table["target_share"].to_numpy()
    sched = D.prepare(seg, order, cluster, length, length_bins=8, target_share=target)
    assert sched.n_sequences == order.size  # one unrolled sequence per position
    end = D.prefix_errors(sched.clusters, sched.position, np.array([order.size]))[0]
    realized = table["realized_share"].to_numpy()
    assert end == pytest.approx(np.linalg.norm(realized - target), rel=1e-9)  # the whole schedule against the target
    corpus_sched = D.prepare(seg, np.unique(seg["sequence_id"].to_numpy()), cluster, length, length_bins=8)
    assert D.batch_deviations(sched.clusters, sched.position, 32).mean() < 0.5 * D.batch_deviations(
        D.prepare(seg, np.unique(seg["sequence_id"].to_numpy()), cluster, length, length_bins=8, target_share=target).clusters,
        corpus_sched.position, 32).mean()  # the corpus in packing order is far from the mixture, the schedule is not
    with pytest.raises(StrataInputError, match="with its target_share"):
        D.prepare(seg, order, cluster, length, length_bins=8)  # a schedule without its targets is refused as before


def test_registered_with_its_config_keys():
    from pipeline.config import StrataConfig

    spec = strategies.spec("greedy_mixture")
    assert spec.realizes_mixture and spec.level == "sequence" and "greedy_mixture" in strategies.SEQUENCE_LEVEL
    assert {"mixture_weights_file", "mixture_budget_tokens", "max_sequence_copies", "mixture_tolerance"} <= set(spec.reads)
    cfg = StrataConfig(strategies=["random", "greedy_mixture"], max_sequence_copies=2, mixture_weights_file="w.json")
    p = OrderParams.from_config(cfg)
    assert (p.max_sequence_copies, p.mixture_weights_file, p.mixture_budget_tokens) == (2, "w.json", 0)
    with pytest.raises(StrataInputError, match="needs mixture weights"):
        run_strategy("greedy_mixture", *corpus(5, n=200), L, OrderParams(), 0)


@pytest.mark.integration
def test_orderings_diagnostics_and_export_on_a_data_root(tmp_path):
    """``strata run`` to the diagnostics with greedy_mixture and a weights file, then ``strata export``."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import duckdb
    import yaml
    from helpers import demo_slice

    from pipeline.packing.stored import sequence_store
    from pipeline.storage.layout import Layout, Store

    repo = Path(__file__).resolve().parents[1]
    corpus_path = tmp_path / "corpus.jsonl"
    corpus_path.write_text("".join(json.dumps(r) + "\n" for r in demo_slice(120)))
    weights = tmp_path / "weights.json"
    cfg = {"data_root": str(tmp_path / "root"), "corpus": {"path": str(corpus_path), "source_field": "domain"},
           "heldout_fraction": 0.0, "vocab_size": 300, "k": 3, "seq_len": 64, "length_bins": 4, "batch_size": 4,
           "embed_method": "shallow", "embed_max_tokens": 32, "strategies": ["random", "greedy_mixture"],
           "mixture_weights_file": str(weights), "max_sequence_copies": 3, "stationarity_shuffles": 5}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(repo)}
    cli = [sys.executable, "-m", "assets.cli"]

    def run(select: str) -> None:
        proc = subprocess.run([*cli, "run", "--config", str(tmp_path / "cfg.yaml"), "--select", select],
                              capture_output=True, text=True, env=env, cwd=repo, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]

    run("*sequences")
    layout = Layout(tmp_path / "root")
    tokens = pl.read_parquet(layout.documents).join(pl.read_parquet(layout.clusters), on="doc_id").group_by("cluster").agg(
        pl.col("n_tokens").sum()).sort("cluster")
    share = tokens["n_tokens"].to_numpy() / tokens["n_tokens"].sum()
    want = share * np.array([1.5, 0.5, 1.0]) / (share * np.array([1.5, 0.5, 1.0])).sum()  # a mixture within reach of 3 copies
    weights.write_text(json.dumps({str(j): float(v) for j, v in enumerate(want)}))
    run("key:orderings or key:ordering_diagnostics")
    layout = Layout(tmp_path / "root")
    ordering = Store(layout).ordering("greedy_mixture")
    table = pl.read_parquet(layout.ordering_mixture("greedy_mixture"))
    m = int(ordering.segments["sequence_id"].max()) + 1
    assert np.bincount(ordering.order, minlength=m).max() <= 3 and np.bincount(ordering.order, minlength=m).max() > 1
    assert schedule_problems(ordering.order, m, table, 3) == []
    np.testing.assert_allclose(ordering.target_share, want)
    assert l1_distance(table) <= 0.05  # mixture_tolerance: the check passed
    assert not layout.ordering_mixture("random").exists()
    con = duckdb.connect(str(layout.duckdb), read_only=True)
    rows = con.sql("SELECT * FROM mixture_schedule WHERE strategy = 'greedy_mixture' ORDER BY cluster").pl()
    assert rows["realized_share"].to_list() == table["realized_share"].to_list()
    metrics = con.sql("SELECT metric FROM ordering_metrics WHERE strategy = 'greedy_mixture'").pl()
    assert "batch_dev_clusters_mean" in metrics["metric"].to_list()
    con.close()
    out = tmp_path / "export"
    exp = subprocess.run([*cli, "export", "--data-root", str(layout.root), "--config", str(tmp_path / "cfg.yaml"),
                          "--strategy", "greedy_mixture", "--format", "numpy", "--out", str(out)],
                         capture_output=True, text=True, env=env, cwd=repo, timeout=600)
    assert exp.returncode == 0, exp.stdout[-2000:] + exp.stderr[-3000:]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["n_sequences"] == ordering.order.size
    seq = Store(layout).sequences
    got = np.fromfile(out / "tokens.bin", dtype=meta["dtype"]).reshape(-1, seq.seq_len)
    np.testing.assert_array_equal(got, sequence_store(layout).batch(ordering.order)[0])  # repetitions written out, position for position


def test_schedule_cli(tmp_path):
    from pipeline.cli.schedule import run_cli

    docs, seg = corpus(6, n=400)
    d = seg["doc_id"].to_numpy()
    seg.with_columns(cluster=pl.Series(docs["cluster"].to_numpy()[d]),
                     doc_length=pl.Series(docs["n_tokens"].to_numpy()[d])).write_parquet(tmp_path / "seg.parquet")
    w = weights_file(tmp_path, {0: 0.7, 1: 0.3})
    assert run_cli(["schedule", str(tmp_path / "seg.parquet"), "--strategy", "greedy_mixture", "--mixture-weights", w,
                    "--max-repeats", "2", "--length-bins", "8", "--out", str(tmp_path / "o.parquet")]) == 0
    ids = pl.read_parquet(tmp_path / "o.parquet")["sequence_id"].to_numpy()
    table = accounting(ids, cluster_tokens(seg, docs["cluster"].to_numpy()), load_weights(w, K))
    assert np.bincount(ids).max() <= 2 and l1_distance(table) < 0.05


def test_weights_default_to_the_mixture_stage(tmp_path):
    from pipeline.config import StrataConfig
    from pipeline.ordering.stage import OrderStageParams, order_params
    from pipeline.storage.layout import Layout

    layout = Layout(tmp_path)
    cfg = StrataConfig(strategies=["greedy_mixture"])
    # no stage output, no file: greedy_mixture stops with the fix
    assert order_params(OrderStageParams.from_config(cfg), layout).mixture_weights_file is None
    layout.mixture_weights.parent.mkdir(parents=True)
    pl.DataFrame({"iteration": [0, 0], "cluster": [0, 1], "weight": [0.5, 0.5]}).write_parquet(layout.mixture_weights)
    assert order_params(OrderStageParams.from_config(cfg), layout).mixture_weights_file == str(layout.mixture_weights)
    mine = weights_file(tmp_path, {0: 1.0})
    mine_cfg = cfg.model_copy(update={"mixture_weights_file": mine})
    assert order_params(OrderStageParams.from_config(mine_cfg), layout).mixture_weights_file == mine
