"""engine: ray on a real two-node Ray cluster (two raylets on this machine, 1 CPU each): same bytes
as engine: local, a killed worker or driver changes nothing, bad input names its file and line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import demo_slice

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray", reason="install the ray extra: pip install -e '.[ray]'")

UPSTREAM = ["corpus", "tokenizer", "tokens", "embeddings", "centroids", "clusters", "clean", "sequences"]
STRATEGIES = ["random", "greedy"]
N_DOCS, SHARD_DOCS = 120, 40  # three shards


@pytest.fixture(scope="module")
def ray_cluster():
    """A head node and a second node, separate raylets with 1 CPU each; yields (address, temp dir)."""
    from pipeline.distributed.local_cluster import local_cluster

    with local_cluster([1, 1]) as cluster:
        yield cluster


# --------------------------------------------------------------------------- graph runs
def _config(tmp: Path, name: str, engine: str, address: str = "") -> Path:
    corpus = tmp.parent / "corpus.jsonl"  # one file for both engines: the shard manifest records its path
    if not corpus.exists():
        corpus.write_text("".join(json.dumps(r) + "\n" for r in demo_slice(N_DOCS)))
    cfg = {
        "data_root": str(tmp / name), "corpus": {"path": str(corpus), "source_field": "domain"},
        "heldout_fraction": 0.05, "vocab_size": 400, "k": 4, "seq_len": 64, "length_bins": 8, "batch_size": 8,
        "embed_max_tokens": 48, "strategies": STRATEGIES, "shard_docs": SHARD_DOCS,
        "engine": engine, "ray": {"address": address, "max_retries": 3},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def materialize(config: Path, selection: list[str], partition: str | None = None):
    """Materialize ``selection`` (one partition) in this process, as ``strata run`` does."""
    import dagster as dg

    from assets.common import sync_partitions
    from assets.definitions import build_definitions
    from pipeline.config import resolve_config

    root = Path(yaml.safe_load(config.read_text())["data_root"])
    root.mkdir(parents=True, exist_ok=True)
    defs = build_definitions(str(config), None)
    instance = dg.DagsterInstance.ephemeral()
    sync_partitions(instance, resolve_config(str(config)))  # strategies and seeds are dynamic partitions
    return dg.materialize(list(defs.assets), selection=selection, partition_key=partition, raise_on_error=True,
                          resources=defs.resources, instance=instance)


def _through_orderings(config: Path) -> None:
    materialize(config, UPSTREAM)
    for s in STRATEGIES:
        materialize(config, ["orderings"], s)


def _artifacts(root: Path) -> dict[str, bytes]:
    from pipeline.storage.atomic import is_sidecar  # digest records hold modification times, not artifact bytes

    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith("strata.duckdb") and not is_sidecar(p)}


def _metadata(result, asset: str) -> dict:
    import dagster as dg

    mats = [e for e in result.get_asset_materialization_events() if e.asset_key == dg.AssetKey(asset)]
    return {k: v.value for k, v in mats[-1].materialization.metadata.items()}


@pytest.fixture(scope="module")
def local_root(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("local")
    _through_orderings(_config(tmp, "root", "local"))
    return tmp / "root"


@pytest.fixture(scope="module")
def ray_root(ray_cluster, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("ray")
    _through_orderings(_config(tmp, "root", "ray", ray_cluster[0]))
    return tmp / "root"


# --------------------------------------------------------------------------- tests
def test_ray_engine_writes_the_local_bytes(local_root, ray_root):
    local, remote = _artifacts(local_root), _artifacts(ray_root)
    assert "embeddings/runs.parquet" in local and "orderings/greedy.parquet" in local and "tokens/runs.parquet" in local
    assert sorted(remote) == sorted(local)
    assert [k for k in local if local[k] != remote[k]] == []
    import duckdb

    with duckdb.connect(str(ray_root / "strata.duckdb"), read_only=True) as con:
        params = dict(con.execute("SELECT asset, parameters FROM lineage WHERE asset IN ('tokens', 'embeddings')").fetchall())
    assert all(json.loads(p)["engine"] == "ray" for p in params.values()) and len(params) == 2


def _same_embeddings(root: Path, local_root: Path) -> None:
    """The embedding index (its shard files' SHA-256 included) and the rows it reads equal the local engine's."""
    from pipeline.represent.embedding_index import open_embeddings

    assert (root / "embeddings" / "runs.parquet").read_bytes() == (local_root / "embeddings" / "runs.parquet").read_bytes()
    np.testing.assert_array_equal(np.asarray(open_embeddings(root / "embeddings" / "runs.parquet")),
                                  np.asarray(open_embeddings(local_root / "embeddings" / "runs.parquet")))


def _actor_running_a_shard(temp_dir: Path) -> int | None:
    from pipeline.distributed.local_cluster import cluster_pids, process_title

    return next((pid for pid in cluster_pids(temp_dir) if process_title(pid).startswith("ray::ShardActor.run")), None)


def test_worker_killed_during_embedding_gives_identical_artifacts(ray_cluster, local_root, tmp_path):
    address, temp_dir = ray_cluster
    config = _config(tmp_path, "root", "ray", address)
    materialize(config, ["corpus"])
    killed: list[int] = []
    running = threading.Event()
    running.set()

    def kill_first_busy_actor() -> None:
        while running.is_set() and not killed:
            pid = _actor_running_a_shard(temp_dir)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.02)

    watcher = threading.Thread(target=kill_first_busy_actor, daemon=True)
    watcher.start()
    try:
        result = materialize(config, ["embeddings"])
    finally:
        running.clear()
        watcher.join()
    assert killed, "no embedding actor was caught running a shard"
    assert _metadata(result, "embeddings")["units"] == N_DOCS // SHARD_DOCS
    _same_embeddings(tmp_path / "root", local_root)


_DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from pipeline.offline import set_offline
set_offline()
from test_distributed import materialize
materialize(Path({config!r}), ["embeddings"])
"""


def test_driver_killed_midway_rerun_resumes_and_matches(ray_cluster, local_root, tmp_path):
    address, _ = ray_cluster
    config = _config(tmp_path, "root", "ray", address)
    materialize(config, ["corpus"])
    work = tmp_path / "root" / "work" / "embeddings"
    code = _DRIVER.format(tests=str(Path(__file__).parent), config=str(config))
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not list(work.glob("embeddings-*.npz")) and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(driver.pid, signal.SIGKILL)
    finally:
        driver.wait()
    written = len(list(work.glob("embeddings-*.npz")))
    assert 1 <= written < N_DOCS // SHARD_DOCS, f"{written} units written when the driver was killed"
    assert not (tmp_path / "root" / "embeddings" / "runs.parquet").exists()
    meta = _metadata(materialize(config, ["embeddings"]), "embeddings")
    assert meta["units_resumed"] == written and meta["units"] == N_DOCS // SHARD_DOCS
    _same_embeddings(tmp_path / "root", local_root)
    assert not list(work.glob("*.npz"))  # unit files are removed once the shard's artifact exists


def test_bad_record_in_one_shard_fails_with_its_file_and_line(ray_cluster, tmp_path):
    """The corpus stage validates shards as Ray tasks: a bad record fails with the local message."""
    from pipeline.config import CorpusConfig, RayConfig
    from pipeline.data.corpus import build_corpus
    from pipeline.errors import StrataInputError

    address, _ = ray_cluster
    records = demo_slice(9)
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(3):
        lines = [json.dumps(r) for r in records[3 * i : 3 * i + 3]]
        if i == 1:
            lines[1] = lines[1][:-5]  # a truncated JSON object on line 2 of shard 1
        (raw / f"shard-{i}.jsonl").write_text("\n".join(lines) + "\n")
    messages = {}
    for engine in ("local", "ray"):
        out = tmp_path / engine
        with pytest.raises(StrataInputError) as err:
            build_corpus(CorpusConfig(path=str(raw), source_field="domain"), 0, 0.0, out / "shards", out / "corpus.parquet",
                         engine=engine, ray_cfg=RayConfig(address=address))
        messages[engine] = str(err.value)
        validated = {json.loads(p.read_text())["unit"] for p in (out / "shards").glob("*.json")}
        assert str(raw / "shard-0.jsonl") in validated and str(raw / "shard-1.jsonl") not in validated
        assert not (out / "corpus.parquet").exists()
    assert messages["ray"] == messages["local"]
    assert messages["ray"].startswith(f"{raw / 'shard-1.jsonl'}, line 2: malformed JSON")
    assert "Traceback" not in messages["ray"] and "Ray" not in messages["ray"]


def test_training_and_evaluation_partitions_run_as_ray_tasks(local_root, ray_root):
    """training_runs and evaluations [random, seed 0] on the cluster: each its own Dagster run on a
    Ray worker, the local bytes."""
    import dagster as dg
    import duckdb

    partition = dg.MultiPartitionKey({"strategy": "random", "seed": "0"})
    results = {}
    for root in (local_root, ray_root):
        config = root.parent / "root.yaml"
        cfg = yaml.safe_load(config.read_text())
        config.write_text(yaml.safe_dump({**cfg, "max_steps": 3, "warmup_steps": 1, "probe_fractions": [1.0]}))
        results[root] = materialize(config, ["training_runs"], partition)
    assert _metadata(results[ray_root], "training_runs")["engine"] == "ray"
    with duckdb.connect(str(ray_root / "strata.duckdb"), read_only=True) as con:
        (run_id,) = con.execute("SELECT run_id FROM lineage WHERE asset = 'training_runs'").fetchone()
    assert run_id != results[ray_root].run_id  # materialized by the worker's own run, not in this process
    for name in ("log.parquet", "stream.parquet", "model/model.safetensors"):
        ours = (ray_root / "runs" / "random" / "seed0" / name).read_bytes()
        assert ours == (local_root / "runs" / "random" / "seed0" / name).read_bytes(), name
    for root in (local_root, ray_root):
        results[root] = materialize(root.parent / "root.yaml", ["evaluations"], partition)
    assert _metadata(results[ray_root], "evaluations")["engine"] == "ray"
    evals = sorted(p.relative_to(local_root) for p in (local_root / "evals").glob("random.seed0*.parquet"))
    assert evals and sorted(p.relative_to(ray_root) for p in (ray_root / "evals").glob("random.seed0*.parquet")) == evals
    for name in evals:
        assert (ray_root / name).read_bytes() == (local_root / name).read_bytes(), name
