"""The data root remembers its config: `strata run`/`demo` record it, the UI and `strata status` read it,
and removing partitions that hold materializations says so in the UI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg

from assets.common import sync_partitions
from pipeline.config import StrataConfig, load_config, resolve_config
from pipeline.config_source import RECORDED_CONFIG, config_source, default_data_root, record_config

REPO = Path(__file__).resolve().parents[1]


def test_recorded_config_round_trips_and_follows_a_moved_root(tmp_path):
    cfg = StrataConfig(data_root=str(tmp_path / "a"), seeds=[0, 1, 2], k=7)
    path = record_config(cfg)
    assert path == tmp_path / "a" / RECORDED_CONFIG
    assert "data_root" not in load_config(path).model_fields_set  # the folder it lies in: same bytes wherever the root is
    assert resolve_config(path, tmp_path / "a", environ={}) == cfg
    first = path.read_bytes()
    assert record_config(cfg).read_bytes() == first  # same config, same bytes
    shutil.move(tmp_path / "a", tmp_path / "b")
    file, root = config_source(tmp_path / "b", environ={})
    moved = resolve_config(file, root, environ={})
    assert (moved.seeds, moved.k, moved.root) == ([0, 1, 2], 7, tmp_path / "b")


def test_lookup_order_of_the_data_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    record_config(StrataConfig(data_root=str(tmp_path / "built"), seeds=[0, 1, 2]))
    (tmp_path / "bare").mkdir()
    assert default_data_root({}) == tmp_path / ".strata"
    assert default_data_root({"DAGSTER_HOME": str(tmp_path / "built" / "dagster")}) == tmp_path / "built"
    # DAGSTER_HOME under a root that records no config does not name the data root
    assert default_data_root({"DAGSTER_HOME": str(tmp_path / "bare" / "dagster")}) == tmp_path / ".strata"
    assert default_data_root({"STRATA_HOME": "bare", "DAGSTER_HOME": str(tmp_path / "built" / "dagster")}) == tmp_path / "bare"
    assert config_source(environ={"DAGSTER_HOME": str(tmp_path / "built" / "dagster")}) == (
        str(tmp_path / "built" / RECORDED_CONFIG), str(tmp_path / "built"))
    assert config_source(environ={"STRATA_CONFIG": "my.yaml", "DAGSTER_HOME": str(tmp_path / "built" / "dagster")}) == ("my.yaml", None)
    assert config_source(environ={"STRATA_HOME": "bare"}) == (None, None)  # nothing recorded: the defaults, as before


def test_removing_materialized_partitions_leaves_a_note(tmp_path):
    from assets.definitions import build_definitions

    graph = build_definitions(None, str(tmp_path / "root")).resolve_asset_graph()
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        sync_partitions(instance, StrataConfig(strategies=["random", "greedy"], seeds=[0, 1]))
        for part in ("0|random", "1|random", "1|greedy"):
            instance.report_runless_asset_event(dg.AssetMaterialization("training_runs", partition=part))
        instance.report_runless_asset_event(dg.AssetMaterialization("orderings", partition="greedy"))
        changes = sync_partitions(instance, StrataConfig(strategies=["random", "greedy"], seeds=[0]), graph)
        assert changes["removed"] == ["seed=1"]
        assert changes["hidden"] == ["training_runs[1|greedy]", "training_runs[1|random]"]
        notes = instance.fetch_observations(dg.AssetKey("training_runs"), limit=10).records
        assert len(notes) == 1
        meta = notes[0].asset_observation.metadata
        assert meta["strata/hidden_partitions"].value == "- `1|greedy`\n- `1|random`"
        assert "seed partitions ['1']" in meta["strata/why"].value
        # seed 1 is gone already: removing greedy hides its ordering, not training_runs[1|greedy] again
        assert sync_partitions(instance, StrataConfig(strategies=["random", "odm"], seeds=[0]), graph)["hidden"] == ["orderings[greedy]"]
        # a removal that hides nothing says nothing
        changes = sync_partitions(instance, StrataConfig(strategies=["random"], seeds=[0]), graph)
        assert changes["removed"] == ["strategy=odm"] and "hidden" not in changes


def _status(env_extra: dict, args: list[str], cwd: Path) -> list[dict]:
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(REPO), **env_extra}
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "status", "--json", *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_status_without_a_config_reads_the_recorded_one(tmp_path):
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "a", "text": "one document"}) + "\n")
    root = tmp_path / "root"
    record_config(StrataConfig(data_root=str(root), strategies=["random"], seeds=[0, 1, 2],
                               corpus={"path": str(tmp_path / "c.jsonl")}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for env, args in (({}, ["--data-root", str(root)]), ({"DAGSTER_HOME": str(root / "dagster")}, [])):
        rows = _status(env, args, elsewhere)
        runs = sorted(r["partition"] for r in rows if r["asset"] == "training_runs")
        assert runs == ["0|random", "1|random", "2|random"], (env, args, runs)
    assert not (elsewhere / ".strata").exists()
    rows = _status({}, [], elsewhere)  # no recorded config anywhere: the defaults (seed 0, every default strategy)
    assert {r["partition"].split("|")[0] for r in rows if r["asset"] == "training_runs"} == {"0"}


def test_the_sensor_says_when_it_hides_materializations(tmp_path):
    from assets.definitions import build_definitions

    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "a", "text": "one document"}) + "\n")
    path = record_config(StrataConfig(data_root=str(tmp_path / "root"), strategies=["random"], seeds=[0],
                                      corpus={"path": str(tmp_path / "c.jsonl")}))
    defs = build_definitions(str(path), str(tmp_path / "root"))
    (tmp_path / "instance").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "instance")) as instance:
        instance.add_dynamic_partitions("seed", ["0", "1"])
        instance.add_dynamic_partitions("strategy", ["random"])
        instance.report_runless_asset_event(dg.AssetMaterialization("evaluations", partition="1|random"))
        tick = defs.get_sensor_def("strata_config")(dg.build_sensor_context(instance=instance, definitions=defs))
        assert "'removed': ['seed=1']" in tick.skip_message and "'hidden': ['evaluations[1|random]']" in tick.skip_message
        assert "listed in each asset's Events" in tick.skip_message
        assert len(instance.fetch_observations(dg.AssetKey("evaluations"), limit=5).records) == 1
