"""The whole asset graph, materialized for real on a slice of the demo corpus via ``strata run``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import dagster as dg
import duckdb
import numpy as np
import polars as pl
import pytest
import yaml
from helpers import DATA, demo_slice

from pipeline.data.tokens import open_tokens
from pipeline.packing.stored import sequence_store
from pipeline.reports.diagnostics import batch_deviations, prepare
from pipeline.storage.layout import Layout

pytestmark = pytest.mark.integration

STRATEGIES = ["random", "greedy", "odm"]


def _strata(args: list[str], env_extra: dict, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-m", "assets.cli", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=900)


@pytest.fixture(scope="module")
def run(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("graph")
    corpus = tmp / "corpus.jsonl"
    with open(corpus, "w") as fh:
        for rec in demo_slice(320):
            fh.write(json.dumps(rec) + "\n")
    cfg = {
        "data_root": str(tmp / "root"),
        "corpus": {"path": str(corpus), "source_field": "domain"},
        "heldout_fraction": 0.05,
        "vocab_size": 512,
        "k": 6,
        "seq_len": 64,
        "length_bins": 8,
        "strategies": STRATEGIES,
        "batch_size": 8,
        "max_steps": 4,
        "warmup_steps": 1,
        "eval_limit": 2,
        "embed_max_tokens": 64,
        "wikitext_path": str(DATA / "eval" / "wikitext" / "wiki.test.raw"),
        "dclm_dir": str(DATA / "eval" / "dclm_core"),
        "dclm_limit": 1,
    }
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    root = request.config.rootpath
    proc = _strata(["run", "--config", str(tmp / "cfg.yaml")], {"DAGSTER_HOME": ""}, root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return Layout(tmp / "root"), cfg, proc


def test_orderings_are_permutations(run):
    layout, cfg, _ = run
    m = int(pl.read_parquet(layout.segments)["sequence_id"].max()) + 1
    for s in STRATEGIES:
        order = pl.read_parquet(layout.ordering(s))
        assert order["position"].to_list() == list(range(m))
        assert sorted(order["sequence_id"].to_list()) == list(range(m))


def test_every_token_once_or_reported(run):
    layout, cfg, _ = run
    tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
    seg = pl.read_parquet(layout.segments)
    L = cfg["seq_len"]
    m = int(seg["sequence_id"].max()) + 1
    rows = sequence_store(layout).rows(np.arange(m))
    np.testing.assert_array_equal(rows, sequence_store(layout).batch(np.arange(m))[0])
    covered = np.zeros(tokens.size, dtype=np.int64)
    for s, start, d, dstart, n in seg.select("sequence_id", "seq_token_start", "doc_id", "doc_token_start", "n_tokens").iter_rows():
        src = offsets[d] + dstart
        covered[src : src + n] += 1
        assert np.array_equal(rows[s, start : start + n], tokens[src : src + n])
    assert covered.max() == 1
    dropped = int((covered == 0).sum())
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        reported = dict(con.execute("SELECT metric, value FROM packing_stats").fetchall())
    # the clean stage's removals (here a document holding a DCLM-core passage) are in no sequence
    # either, accounted by reason
    removed = int(sum(v for k, v in reported.items() if k.startswith("tokens_removed_")))
    assert dropped == reported["tokens_dropped"] + removed and reported["tokens_dropped"] < L
    assert reported["tokens_in"] + removed == tokens.size


def test_greedy_batches_closer_to_global_shares_than_random(run):
    layout, cfg, _ = run
    docs = pl.read_parquet(layout.documents).join(pl.read_parquet(layout.clusters), on="doc_id").sort("doc_id")
    seg = pl.read_parquet(layout.segments)
    dev = {}
    for s in STRATEGIES:
        sched = prepare(seg, pl.read_parquet(layout.ordering(s)), docs["cluster"].to_numpy(), docs["n_tokens"].to_numpy() + 1,
                        length_bins=8)
        dev[s] = batch_deviations(sched.clusters, sched.position, cfg["batch_size"])
    assert dev["greedy"].max() < dev["random"].max()
    assert dev["greedy"].mean() < dev["random"].mean()


def test_duckdb_lineage_and_report(run):
    layout, cfg, proc = run
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        assets = {a for (a,) in con.execute("SELECT DISTINCT asset FROM lineage").fetchall()}
        steps = con.execute("SELECT strategy, count(*) FROM train_log GROUP BY 1 ORDER BY 1").fetchall()
        evals = {s for (s,) in con.execute("SELECT DISTINCT suite FROM eval_results").fetchall()}
        core = con.execute("SELECT value FROM eval_results WHERE suite = 'dclm' AND metric = 'core_v2'").fetchall()
        ablation = con.execute("SELECT DISTINCT strategy FROM ablation ORDER BY 1").fetchall()
        outputs = con.execute("SELECT outputs FROM lineage WHERE asset = 'sequences'").fetchone()[0]
    assert assets == {"corpus_shards", "corpus", "tokenizer", "token_shards", "tokens", "embedding_shards", "embeddings", "centroids",
                      "cluster_shards", "clusters", "clean_shards", "clean", "sequences", "orderings", "exports",
                      "ordering_diagnostics", "diagnostics_report", "training_runs", "gradient_analyses", "claims", "evaluations",
                      "ablation_report"}
    assert steps == [(s, cfg["max_steps"]) for s in sorted(STRATEGIES)]
    assert evals == {"heldout", "wikitext", "dclm"}
    assert len(core) == len(STRATEGIES) and all(-1.0 <= v <= 1.0 for (v,) in core)
    assert ablation == [(s,) for s in sorted(STRATEGIES)]
    assert str(layout.segments) in outputs
    report = layout.report.read_text()
    assert "heldout_batch/loss" in report and all(s in report for s in STRATEGIES)
    assert "heldout_batch/loss" in proc.stdout  # the CLI prints the table
    assert "Difference to `random`" in report and "Diversity of the consumed stream" in report
    assert "## Claims of the papers, reproduced on this corpus" in report and "(report/claims/claim_prefix_error.png)" in report
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        deltas = con.execute("SELECT strategy, metric, ci_low, ci_high, significant FROM ablation_delta").fetchall()
        consumed = con.execute("SELECT DISTINCT strategy FROM consumed_metrics ORDER BY 1").fetchall()
        curve_steps = con.execute("SELECT DISTINCT step FROM heldout_curve ORDER BY 1").fetchall()
        odm_diag = con.execute("SELECT count(*) FROM ordering_metrics WHERE strategy = 'odm'").fetchone()[0]
    assert {s for s, *_ in deltas} == {"greedy", "odm"}
    # one seed: per-document metrics get a bootstrap interval; single-value metrics have none (NaN) and are never significant
    undefined = lambda v: v is None or math.isnan(v)  # noqa: E731
    defined = [(lo, hi, sig) for _, _, lo, hi, sig in deltas if not (undefined(lo) or undefined(hi))]
    assert defined and all(lo <= hi and sig == (lo > 0 or hi < 0) for lo, hi, sig in defined)
    assert not any(sig for _, _, lo, hi, sig in deltas if undefined(lo) or undefined(hi))
    assert consumed == [(s,) for s in sorted(STRATEGIES)] and odm_diag == 0
    assert [s for (s,) in curve_steps] == [0, cfg["max_steps"]]
    assert (layout.run_dir("greedy", 0) / "model" / "config.json").exists()
    # the exports asset wrote the greedy ordering in training order (numpy is the default format)
    order = pl.read_parquet(layout.ordering("greedy")).sort("position")["sequence_id"].to_numpy()
    exported = np.fromfile(layout.export_dir("greedy", "numpy") / "tokens.bin", dtype=np.uint16).reshape(-1, cfg["seq_len"])
    np.testing.assert_array_equal(exported, sequence_store(layout).batch(order)[0])
    assert not layout.export_dir("odm", "numpy").exists()


def test_lineage_inputs_are_the_declared_deps(run):
    """Each lineage row's inputs are its asset's declared deps (the one list in its decorator), with
    the partitions it read: a gather names every shard's partition, a training run its ordering."""
    from assets.definitions import build_definitions

    layout, cfg, _ = run
    graph = build_definitions(None, str(layout.root)).resolve_asset_graph()
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        rows = con.execute("SELECT asset, partition, arg_max(input_versions, created_at) FROM lineage GROUP BY 1, 2").fetchall()
    inputs = {(a, p): json.loads(i) for a, p, i in rows}
    for (asset, partition), found in inputs.items():
        node = graph.get(dg.AssetKey(asset))
        declared = {k.to_user_string() for k in node.parent_keys if graph.get(k).is_materializable
                    and graph.get(k).group_name != "quality"}  # quality is off here: a stage that never ran is no input
        assert {k.split("[")[0] for k in found} == declared, (asset, partition)
    shards = sorted(p for a, p in inputs if a == "corpus_shards")
    assert set(inputs["tokens", ""]) == {"corpus", "tokenizer", *(f"token_shards[{p}]" for p in shards)}
    assert set(inputs["clusters", ""]) == {"corpus", "centroids", *(f"cluster_shards[{p}]" for p in shards)}
    assert set(inputs["training_runs", "0|greedy"]) == {"orderings[greedy]"}
    assert set(inputs["evaluations", "0|greedy"]) == {"training_runs[0|greedy]"}
    assert set(inputs["diagnostics_report", ""]) == {"embeddings", "clusters", *(f"ordering_diagnostics[{s}]" for s in STRATEGIES)}


def test_k_larger_than_corpus_is_a_clear_error(tmp_path, request, write_jsonl):
    corpus = write_jsonl([{"id": str(i), "text": f"document number {i} " * 5} for i in range(5)])
    cfg = {"data_root": str(tmp_path / "root"), "corpus": {"path": str(corpus)}, "k": 50, "heldout_fraction": 0.0, "vocab_size": 300}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    proc = _strata(["run", "--config", str(tmp_path / "cfg.yaml"), "--select", "*clusters"], {"DAGSTER_HOME": ""},
                   request.config.rootpath)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "k=50 clusters for 5 documents is impossible" in proc.stderr and "Fix: set k between 1 and 5" in proc.stderr
