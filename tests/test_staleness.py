"""Staleness that tells the truth: after a change, Dagster marks exactly the affected assets stale.

The whole graph is materialized once in process into a temporary Dagster instance; each change
(corpus edit, k, seq_len, embed_method, lam, model_preset) then rebuilds the definitions from the
changed config and asks the instance which assets are stale — the resolver the Dagster UI uses,
through ``assets.status`` (what ``strata status`` prints).
"""

from __future__ import annotations

import json

import dagster as dg
import pytest
import yaml
from helpers import demo_slice

pytestmark = pytest.mark.integration

ALL = {"corpus_shards", "corpus", "tokenizer", "token_shards", "tokens", "embedding_shards", "embeddings", "centroids", "cluster_shards",
       "clusters", "clean_shards", "clean", "sequences", "orderings", "exports", "ordering_diagnostics",
       "diagnostics_report", "training_runs", "gradient_analyses", "claims", "evaluations", "ablation_report"}
AFTER_ORDERINGS = {"orderings", "exports", "ordering_diagnostics", "diagnostics_report", "training_runs", "gradient_analyses",
                   "claims", "evaluations", "ablation_report"}
TRAINING = {"training_runs", "gradient_analyses", "claims", "evaluations", "ablation_report"}
EXPECTED = {
    "k": (8, {"centroids", "cluster_shards", "clusters", "clean", "sequences"} | AFTER_ORDERINGS),
    "seq_len": (48, {"sequences"} | AFTER_ORDERINGS),
    "embed_method": ("sentence",
                     {"embedding_shards", "embeddings", "centroids", "cluster_shards", "clusters", "clean", "sequences"}
                     | AFTER_ORDERINGS),
    "lam": (0.5, AFTER_ORDERINGS),
    "model_preset": ("small", TRAINING),
}


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    from assets.runner import materialize_all

    tmp = tmp_path_factory.mktemp("stale")
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in demo_slice(60)))
    cfg = {"data_root": str(tmp / "root"), "corpus": {"path": str(corpus), "source_field": "domain"},
           "heldout_fraction": 0.05, "vocab_size": 300, "k": 4, "seq_len": 64, "length_bins": 4, "batch_size": 4,
           "embed_method": "shallow", "embed_max_tokens": 32, "strategies": ["random"], "max_steps": 2,
           "warmup_steps": 1, "eval_limit": 1, "fidelity_chunks": 2, "probe_batches": 1}
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    (tmp / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp / "dagster")) as instance:
        materialize_all(str(path), None, log=lambda *_: None, log_level="WARNING", instance=instance)
        yield instance, cfg, tmp


def _stale(instance, cfg: dict, tmp) -> tuple[set[str], set[str], list]:
    from assets.definitions import build_definitions
    from assets.status import observe_corpus, statuses
    from pipeline.config import config_from_dict

    path = tmp / "changed.yaml"
    path.write_text(yaml.safe_dump(cfg))
    config = config_from_dict(cfg)
    defs = build_definitions(str(path), None)
    observe_corpus(instance, config)
    rows = statuses(defs, instance, config)
    return {r.asset for r in rows if r.status == "stale"}, {r.asset for r in rows if r.status == "missing"}, rows


def test_everything_fresh_after_a_run(graph):
    instance, cfg, tmp = graph
    stale, missing, rows = _stale(instance, cfg, tmp)
    assert stale == set() and missing == set(), rows
    assert {r.asset for r in rows} == ALL


def test_stationarity_table_and_check_ran(graph):
    """ordering_diagnostics wrote ordering_stationarity and ran its non-blocking check (a WARN at worst: the run went on)."""
    import duckdb

    from pipeline.reports.stationarity import LEVEL

    instance, cfg, tmp = graph
    with duckdb.connect(str(tmp / "root" / "strata.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT characteristic, count(*) FROM ordering_stationarity WHERE strategy = 'random' GROUP BY 1").fetchall()
    assert set(LEVEL) | {"cluster_share_dev", "length_bin_share_dev"} <= {c for c, _ in rows} and {n for _, n in rows} == {11}
    key = dg.AssetCheckKey(dg.AssetKey("ordering_diagnostics"), "ordering_is_stationary")
    records = instance.event_log_storage.get_asset_check_execution_history(key, limit=5)
    evaluation = records[0].event.dagster_event.event_specific_data
    assert evaluation.severity == dg.AssetCheckSeverity.WARN and evaluation.metadata["strategy"].value == "random"
    assert evaluation.partition == "random"  # the check is partitioned like its asset: the UI shows which strategy


@pytest.mark.parametrize("key", list(EXPECTED))
def test_parameter_change_marks_exactly_its_assets_stale(graph, key):
    instance, cfg, tmp = graph
    value, expected = EXPECTED[key]
    stale, missing, rows = _stale(instance, {**cfg, key: value}, tmp)
    assert stale == expected and not missing, rows
    roots = {r.why for r in rows if r.status == "stale"}
    assert all("code version" in why for why in roots), roots


def test_corpus_edit_marks_everything_stale_then_back(graph):
    instance, cfg, tmp = graph
    corpus = tmp / "corpus.jsonl"
    original = corpus.read_text()
    try:
        corpus.write_text(original + json.dumps({"id": "new", "text": "an appended document " * 20, "domain": "new"}) + "\n")
        stale, missing, rows = _stale(instance, cfg, tmp)
        assert stale == ALL and not missing, rows
        assert all("raw_corpus" in r.why or "raw_shards" in r.why for r in rows if r.status == "stale"), rows
    finally:
        corpus.write_text(original)
    stale, _, rows = _stale(instance, cfg, tmp)  # the original content is the materialized version again
    assert stale == set(), rows


def test_declaring_corpus_columns_marks_everything_stale(graph):
    """``corpus.columns`` declared: every shard's reading options and the corpus's parameters changed,
    so everything is stale (a rerun reads the shards again); the config without it is up to date,
    as it was before the key existed."""
    instance, cfg, tmp = graph
    declared = {**cfg, "corpus": {**cfg["corpus"], "columns": {"score": "number"}}}
    stale, missing, rows = _stale(instance, declared, tmp)
    assert stale == ALL and not missing, rows
    assert any("raw_shards" in r.why for r in rows if r.asset == "corpus_shards"), rows
    stale, _, rows = _stale(instance, cfg, tmp)
    assert stale == set(), rows


def _materialize(instance, cfg: dict, tmp, name: str, selection: list[str], run_config: dict | None = None):
    from assets.definitions import build_definitions

    path = tmp / name
    path.write_text(yaml.safe_dump(cfg))
    defs = build_definitions(str(path), None)
    return defs, path, lambda: dg.materialize(list(defs.assets) + list(defs.asset_checks), selection=selection, instance=instance,
                                              resources=defs.resources, run_config=run_config or {}, raise_on_error=False)


def test_config_edited_after_loading_stops_with_the_fix(graph):
    instance, cfg, tmp = graph
    _, path, run = _materialize(instance, {**cfg, "k": 8}, tmp, "loaded.yaml", ["centroids"])
    path.write_text(yaml.safe_dump({**cfg, "k": 5}))  # edited after the definitions were built
    result = run()
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    message = str(failure.step_failure_data.error)
    assert "configuration of `centroids` changed since the Dagster definitions were loaded" in message and "Reload" in message


def test_a_run_launched_from_an_older_load_stops_with_the_fix(graph):
    """The UI's code server loaded k=4; the file now says k=8 and the run's process builds its
    versions from it (assets/loaded.py): centroids refuses to run instead of using k=8 under k=4's version."""
    from assets.definitions import build_definitions
    from assets.loaded import code_versions

    instance, cfg, tmp = graph
    path = tmp / "ui.yaml"
    path.write_text(yaml.safe_dump(cfg))
    ui = code_versions(build_definitions(str(path), None))
    path.write_text(yaml.safe_dump({**cfg, "k": 8}))
    defs = build_definitions(str(path), None, loaded_versions=ui)
    assert defs.resources["settings"].loaded_versions and code_versions(defs)["centroids"] != ui["centroids"]
    result = dg.materialize(list(defs.assets) + list(defs.asset_checks), selection=["centroids"], instance=instance,
                            resources=defs.resources, raise_on_error=False)
    assert not result.success
    message = str(next(e for e in result.all_events if e.is_step_failure).step_failure_data.error)
    assert "configuration of `centroids` changed since the Dagster definitions were loaded" in message and "Reload" in message


def test_up_to_date_checks_show_stale_partitions(graph):
    """After k changes (definitions reloaded), every asset from centroids down warns with its stale
    partitions, the partitioned ones included; nothing upstream does. Reported once, not on every tick."""
    from assets import sync
    from assets.definitions import build_definitions
    from pipeline.config import config_from_dict

    instance, cfg, tmp = graph
    path = tmp / "k8.yaml"
    path.write_text(yaml.safe_dump({**cfg, "k": 8}))
    defs = build_definitions(str(path), None, sync_checks=True)
    graph_ = defs.resolve_asset_graph()
    checked = {k.asset_key.to_user_string() for k in graph_.asset_check_keys if k.name == sync.CHECK}
    assert checked == ALL | {"claim_runs", "quality_shards", "quality"}
    config = config_from_dict({**cfg, "k": 8})
    results = {e.asset_key.to_user_string(): e for e in sync.evaluations(graph_, instance, config)}
    failed = {a for a, e in results.items() if not e.passed}
    assert failed == EXPECTED["k"][1], results
    assert results["orderings"].description.startswith("1 of 1 partitions stale: random")
    training = results["training_runs"]
    assert training.metadata["stale"].value == "1 of 1" and "config changed: k: 4 -> 8" in training.description
    assert results["corpus"].passed and results["corpus"].description == "up to date"
    reported = sync.report_changes(graph_, instance, config)
    assert set(reported) >= failed and sync.report_changes(graph_, instance, config) == []
    key = dg.AssetCheckKey(dg.AssetKey("orderings"), sync.CHECK)
    latest = instance.event_log_storage.get_asset_check_execution_history(key, limit=1)[0]
    assert latest.event.dagster_event.event_specific_data.passed is False

    # materialized from the UI's definitions (the check runs with its asset, here a partition): it passes under k=4
    path.write_text(yaml.safe_dump(cfg))
    defs = build_definitions(str(path), None, sync_checks=True)
    result = dg.materialize(list(defs.assets) + list(defs.asset_checks), selection=["ordering_diagnostics"], partition_key="random",
                            instance=instance, resources=defs.resources)
    evaluation = next(e for e in result.get_asset_check_evaluations() if e.check_name == sync.CHECK)
    assert evaluation.passed and evaluation.description == "up to date (1 partition of the config)", evaluation


def test_tables_carry_their_column_schema(graph):
    instance, _, _ = graph
    meta = instance.get_latest_materialization_event(dg.AssetKey("clusters")).asset_materialization.metadata
    columns = {c.name for c in meta["dagster/column_schema"].schema.columns}
    assert {"doc_id", "cluster"} <= columns


def test_launchpad_override_is_applied_and_recorded(graph):
    """It rematerializes centroids (and clusters) with k=5 from the launchpad (keep it near the end)."""
    import numpy as np

    from pipeline.storage.layout import Layout

    instance, cfg, tmp = graph
    _, _, run = _materialize(instance, cfg, tmp, "same.yaml", ["centroids", "clusters"], {"ops": {"centroids": {"config": {"k": 5}}}})
    result = run()
    assert result.success
    assert np.load(Layout(tmp / "root").centroids).shape[0] == 5
    meta = result.asset_materializations_for_node("centroids")[0].metadata
    assert meta["launchpad_overrides"].value == {"k": 5} and meta["parameter_values"].value["k"] == 5
    stale, _, rows = _stale(instance, cfg, tmp)
    # centroids' code version still describes the file (k=4): Dagster calls it fresh and status names
    # the override; its new data makes everything reading it stale (Dagster's data versions), and
    # everything below those stale in turn (assets.dagster_internals.TransitiveStaleResolver)
    why = {r.asset: (r.status, r.why) for r in rows}
    assert why["centroids"] == ("fresh", "built with launchpad overrides: k: 5 -> 4"), rows
    # sequences, diagnostics_report and claims read clusters directly; clusters reads cluster_shards, which
    # Dagster calls stale (a new centroids version) and status missing (below)
    assert stale == {"clusters", "clean", "sequences", "diagnostics_report", "claims"} | AFTER_ORDERINGS, rows
    assert "centroids: has a new data version" in why["clusters"][1]
    assert "has a stale dependency" not in why["sequences"][1] and "clusters: has a new data version" in why["orderings"][1]
    # cluster_shards' recorded shard was replaced on disk by the k=5 run's: status finds it missing
    # (it reports the data root, not only Dagster's memory), which reruns it as stale would.
    assert why["cluster_shards"][0] == "missing" and "clusters/shards/" in why["cluster_shards"][1], rows
    assert "clusters: has a new data version" in why["sequences"][1]


def test_launchpad_families_balance_a_documents_column(graph):
    """After the k test (it rematerializes orderings): the launchpad's `objective: custom` and
    `families` reach the greedy, which balances the documents' `source` column; the materialization
    records both, and families without `objective: custom` stop with the fix."""
    import polars as pl

    from pipeline.ordering import OrderParams, run_strategy
    from pipeline.ordering.stage import ordering_inputs
    from pipeline.storage.layout import Layout

    instance, cfg, tmp = graph
    instance.add_dynamic_partitions("strategy", ["greedy"])
    families = ["cluster", "length_bin:1", "source:2", "documents:0.5:4"]
    launchpad = {"ops": {"orderings": {"config": {"objective": "custom", "families": families}}}}
    defs, _, _ = _materialize(instance, cfg, tmp, "families.yaml", ["orderings"])
    res = dg.materialize(list(defs.assets), selection=["orderings"], partition_key="greedy", instance=instance,
                         resources=defs.resources, run_config=launchpad, raise_on_error=False)
    assert res.success
    meta = res.asset_materializations_for_node("orderings")[0].metadata
    assert meta["launchpad_overrides"].value == {"objective": "custom", "families": families}
    layout = Layout(tmp / "root")
    params = OrderParams(objective="custom", families=tuple(families), length_bins=cfg["length_bins"], batch_size=cfg["batch_size"])
    docs, segments = ordering_inputs(layout, params)
    assert "source" in docs.columns  # read from documents.parquet because a family names it
    expected = run_strategy("greedy", docs, segments, cfg["seq_len"], params, 0).order
    assert pl.read_parquet(layout.ordering("greedy")).equals(expected)
    bad = {"ops": {"orderings": {"config": {"families": families}}}}
    res = dg.materialize(list(defs.assets), selection=["orderings"], partition_key="greedy", instance=instance,
                         resources=defs.resources, run_config=bad, raise_on_error=False)
    failure = next(e for e in res.all_events if e.is_step_failure)
    assert "objective: custom" in str(failure.step_failure_data.error)


def test_greedy_block_shuffle_reuses_the_greedy_partitions_order(graph):
    """`greedy_block_shuffle` shuffles the blocks of the `greedy` partition's materialized order
    when that was made from the same sequences, parameters and seed, and runs the greedy itself
    when not (other parameters, a changed file): the same bytes either way."""
    import polars as pl

    from pipeline.config import config_from_dict
    from pipeline.ordering import run_strategy
    from pipeline.ordering.stage import OrderStageParams, order_params, ordering_inputs
    from pipeline.storage.duck import duck_connection
    from pipeline.storage.layout import Layout
    from pipeline.storage.lineage import newest_row

    instance, cfg, tmp = graph
    instance.add_dynamic_partitions("strategy", ["greedy", "greedy_block_shuffle"])
    blocked = {**cfg, "greedy_exact_max": 4, "seed": 3}  # the blocked greedy: its order depends on the seed
    defs, _, _ = _materialize(instance, blocked, tmp, "blocked.yaml", ["orderings"])
    layout = Layout(tmp / "root")

    def run(strategy: str, run_config: dict | None = None):
        res = dg.materialize(list(defs.assets), selection=["orderings"], partition_key=strategy, instance=instance,
                             resources=defs.resources, run_config=run_config or {}, raise_on_error=False)
        assert res.success
        return res.asset_materializations_for_node("orderings")[0].metadata

    params = order_params(OrderStageParams.from_config(config_from_dict(blocked)), layout)
    docs, segments = ordering_inputs(layout, params)
    expected = run_strategy("greedy_block_shuffle", docs, segments, cfg["seq_len"], params, 3)
    assert expected.greedy_mode == "blocked"
    assert not expected.order.equals(run_strategy("greedy_block_shuffle", docs, segments, cfg["seq_len"], params, 4).order)

    assert run("greedy")["greedy_mode"].value == "blocked"
    meta = run("greedy_block_shuffle")
    assert meta["computed_from"].value == "orderings[greedy]" and meta["greedy_mode"].value == "blocked"
    assert pl.read_parquet(layout.ordering("greedy_block_shuffle")).equals(expected.order)
    with duck_connection(layout.duckdb) as con:
        assert "orderings[greedy]" in newest_row(con, "orderings", "greedy_block_shuffle")["input_versions"]

    run("greedy", {"ops": {"orderings": {"config": {"lam": 0.25}}}})  # greedy made with another lam: not reused
    assert "computed_from" not in run("greedy_block_shuffle")
    assert pl.read_parquet(layout.ordering("greedy_block_shuffle")).equals(expected.order)

    run("greedy")
    pl.DataFrame({"position": [0], "sequence_id": [0]}).write_parquet(layout.ordering("greedy"))  # the file changed since
    assert "computed_from" not in run("greedy_block_shuffle")
    assert pl.read_parquet(layout.ordering("greedy_block_shuffle")).equals(expected.order)


def test_orderings_of_one_packing_share_the_stationarity_band(graph):
    """`ordering_diagnostics[greedy]` reads the band `random`'s partition computed for the same
    sequences (diagnostics/bands/), and writes the same bytes as when it computes the band itself."""
    instance, cfg, tmp = graph
    instance.add_dynamic_partitions("strategy", ["greedy"])
    defs, _, _ = _materialize(instance, cfg, tmp, "band.yaml", ["orderings"])
    root = tmp / "root"

    def run(asset: str, strategy: str) -> dict:
        res = dg.materialize(list(defs.assets) + list(defs.asset_checks), selection=[asset], partition_key=strategy, instance=instance,
                             resources=defs.resources, raise_on_error=False)
        assert res.success
        return res.asset_materializations_for_node(asset)[0].metadata

    run("orderings", "random")
    run("orderings", "greedy")
    run("ordering_diagnostics", "random")  # computes the band of these sequences, or reads it from an earlier test's run
    meta = run("ordering_diagnostics", "greedy")
    assert meta["band"].value.startswith("shuffles of these sequences reused")
    # the worst windows of random's shuffles too (diagnostics/window_bands/), and the figure in the metadata
    assert meta["window_band"].value.startswith("shuffles' worst windows reused") and "data:image/png" in meta["worst_window"].value
    assert (root / "diagnostics" / "greedy.windows.png").is_file()
    reused = (root / "diagnostics" / "greedy.stationarity.parquet").read_bytes()
    reused_metrics = (root / "diagnostics" / "greedy.parquet").read_bytes()
    for p in [*(root / "diagnostics" / "bands").glob("*.npy"), *(root / "diagnostics" / "window_bands").glob("*.npy")]:
        p.unlink()
    meta = run("ordering_diagnostics", "greedy")
    assert meta["band"].value == "shuffles computed" and meta["window_band"].value == "shuffles' worst windows computed"
    assert (root / "diagnostics" / "greedy.stationarity.parquet").read_bytes() == reused
    assert (root / "diagnostics" / "greedy.parquet").read_bytes() == reused_metrics
    assert len(list((root / "diagnostics" / "bands").glob("*.npy"))) == 1
    assert len(list((root / "diagnostics" / "window_bands").glob("*.npy"))) == 1
