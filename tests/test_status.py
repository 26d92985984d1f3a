"""strata status on a fresh root, partitions that follow the config, the training pool, launchpad classes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.common import TRAIN_POOL, sync_partitions
from assets.params import PARAM_CLASSES, PARAMS, SHARED
from pipeline.config import StrataConfig, is_config_key
from pipeline.overrides import launchpad_field

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def instance(tmp_path):
    with dg.instance_for_test(temp_dir=str(tmp_path)) as inst:
        yield inst


def test_partitions_and_pool_follow_the_config(instance):
    assert sync_partitions(instance, StrataConfig(strategies=["random", "greedy"], seeds=[0, 1]))["added"] == [
        "strategy=random", "strategy=greedy", "seed=0", "seed=1", "corpus_shard=builtin"]
    assert instance.event_log_storage.get_concurrency_info(TRAIN_POOL).slot_count == 1
    changes = sync_partitions(instance, StrataConfig(strategies=["greedy", "odm"], seeds=[1], train_concurrency=2))
    assert changes == {"added": ["strategy=odm"], "removed": ["strategy=random", "seed=0"]}
    assert instance.get_dynamic_partitions("strategy") == ["greedy", "odm"] and instance.get_dynamic_partitions("seed") == ["1"]
    assert instance.event_log_storage.get_concurrency_info(TRAIN_POOL).slot_count == 2


def test_training_and_evaluations_hold_the_pool():
    from assets.evaluations import evaluations
    from assets.training import training_runs

    for asset in (training_runs, evaluations):
        assert {op.pool for op in [asset.op]} == {TRAIN_POOL}


def test_lineage_inputs_come_from_the_declared_deps():
    """An asset's lineage inputs are its definition's deps (the corpus sources left out), each with
    the partition the materialization read: the same key where partitioned alike, the strategy of a
    training run, every partition of a partitioned upstream of an unpartitioned asset."""
    from assets.common import declared_inputs
    from assets.definitions import build_definitions

    graph = build_definitions(None, None).resolve_asset_graph()
    run = dg.MultiPartitionKey({"strategy": "greedy", "seed": "0"})

    def inputs(asset: str, partition=None) -> dict:
        deps = {p.to_user_string() for p in graph.get(dg.AssetKey(asset)).parent_keys if graph.get(p).is_materializable}
        found = declared_inputs(graph, dg.AssetKey(asset), partition)
        assert set(found) == deps, asset
        return found

    assert inputs("corpus_shards", "a.jsonl") == {} and inputs("corpus") == {"corpus_shards": "*"}  # raw_* are sources
    assert inputs("token_shards", "a.jsonl") == {"corpus_shards": "a.jsonl", "tokenizer": None}
    assert inputs("tokens") == {"corpus": None, "tokenizer": None, "token_shards": "*"}  # the stage names the shards it read
    assert inputs("training_runs", run) == {"orderings": "greedy"}
    assert inputs("evaluations", run) == {"training_runs": run}
    assert inputs("gradient_analyses") == {"training_runs": "*"}
    assert inputs("exports", "greedy") == {"orderings": "greedy"}
    # the two assets whose recorder once named other inputs than their deps: tokens is read by both
    assert inputs("mixture_iterations", "1") == {"clusters": None, "mixture_target": None, "tokens": None}
    assert inputs("mixture_curriculum") == {"clusters": None, "mixture_target": None, "tokens": None}
    assert inputs("mixture_runs", "greedy_mixture") == {"mixture_curriculum": None, "mixture_weights": None}
    assert inputs("mixture_weights") == {"mixture_iterations": "*"}


def test_dead_process_claims_are_released(instance):
    from dagster import DagsterRun, DagsterRunStatus

    from assets.runner import release_dead_claims

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout
    host = socket.gethostname()
    runs = {"dead": {"strata/pid": dead.strip(), "strata/host": host}, "alive": {"strata/pid": str(os.getpid()), "strata/host": host},
            "ui": {}}
    sync_partitions(instance, StrataConfig(train_concurrency=3))
    for name, tags in runs.items():
        instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id=f"{name}-run", tags=tags, status=DagsterRunStatus.STARTED))
        assert instance.event_log_storage.claim_concurrency_slot(TRAIN_POOL, f"{name}-run", "training_runs").is_claimed
    assert release_dead_claims(instance) == ["dead-run"]
    assert instance.event_log_storage.get_concurrency_info(TRAIN_POOL).active_run_ids == {"alive-run", "ui-run"}
    assert instance.get_run_by_id("dead-run").status == DagsterRunStatus.FAILURE


def test_launchpad_classes_are_the_config_fields():
    for asset, cls in PARAM_CLASSES.items():
        assert issubclass(cls, dg.Config)
        assert set(cls.model_fields) == {launchpad_field(k) for k in set(PARAMS[asset]) - SHARED}
        assert all(is_config_key(k) for k in set(PARAMS[asset]) - SHARED)
    assert PARAM_CLASSES["centroids"](k=5).k == 5 and PARAM_CLASSES["orderings"](lam=0.5).lam == 0.5
    assert PARAM_CLASSES["training_runs"](model_preset="small").model_preset == "small"


def test_status_of_a_fresh_root_lists_every_partition_missing(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"data_root": str(tmp_path / "root"), "strategies": ["random", "greedy"], "seeds": [0, 1],
                                   "corpus": {"path": str(tmp_path / "c.jsonl")}}))
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "a", "text": "one document"}) + "\n")
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "status", "--config", str(cfg), "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    assert {r["status"] for r in rows} == {"missing"}
    parts = {(r["asset"], r["partition"]) for r in rows}
    assert ("orderings", "greedy") in parts and ("training_runs", "1|random") in parts and ("corpus", None) in parts
    # 12 unpartitioned assets (clean among them), 5 per corpus shard, 3 per strategy, 2 per strategy x seed; the
    # mixture stage is off by default, and so are the claims' own runs (claim_runs: listed once materialized or with claims_full)
    assets = {r["asset"] for r in rows}
    assert len(rows) == 12 + 5 + 3 * 2 + 2 * 4 and {"clean", "claims"} <= assets and "claim_runs" not in assets
    assert [r["partition"].split("@")[0] for r in rows if r["asset"] == "corpus_shards"] == ["c.jsonl"]
    assert not any(r["asset"].startswith("mixture") for r in rows)
