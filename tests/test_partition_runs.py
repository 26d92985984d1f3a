"""``strata run`` with the partitions of corpus_shards and cluster_shards side by side in worker
processes (assets/partition_runs.py): the same bytes, data versions and lineage as one partition
after another, runs made by the workers, and a bad record still named by its file and line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import dagster as dg
import duckdb
import pytest
import yaml
from helpers import demo_slice

from assets.partition_runs import side_by_side_workers
from pipeline.errors import StrataInputError

pytestmark = pytest.mark.integration
N_FILES, DOCS_PER_FILE = 4, 24


def _corpus(tmp: Path) -> Path:
    raw = tmp / "raw"
    if not raw.is_dir():
        raw.mkdir()
        docs = demo_slice(N_FILES * DOCS_PER_FILE)
        for i in range(N_FILES):
            part = docs[i * DOCS_PER_FILE : (i + 1) * DOCS_PER_FILE]
            (raw / f"part-{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return raw


def _config(tmp: Path, name: str, workers: int, raw: Path) -> Path:
    cfg = {"data_root": str(tmp / name / "root"), "corpus": {"path": str(raw), "source_field": "domain"},
           "heldout_fraction": 0.05, "vocab_size": 300, "k": 4, "seq_len": 64, "embed_method": "shallow",
           "embed_max_tokens": 32, "strategies": ["random"], "partition_workers": workers}
    (tmp / name).mkdir(exist_ok=True)
    path = tmp / name / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run(path: Path, select: str):
    from assets.runner import materialize_all

    home = path.parent / "dagster"
    home.mkdir(exist_ok=True)
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        materialize_all(str(path), None, select=select, log=lambda *_: None, log_level="WARNING", instance=instance)
        return _runs(instance)


def _runs(instance) -> dict[tuple[str, str], tuple[str, int]]:
    """(asset, partition) -> (data version, pid of the process that ran it) of each shard partition."""
    out = {}
    for asset in ("corpus_shards", "cluster_shards"):
        for rec in instance.fetch_materializations(dg.AssetKey(asset), limit=100).records:
            event = rec.event_log_entry.dagster_event
            mat = event.step_materialization_data.materialization
            out[(asset, mat.partition)] = (mat.tags["dagster/data_version"], event.pid)
    return out


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("side")
    raw = _corpus(tmp)
    return {workers: (tmp / f"w{workers}" / "root", _run(_config(tmp, f"w{workers}", workers, raw), "*cluster_shards"))
            for workers in (1, 2)}


def test_workers_are_used_only_where_they_pay():
    assert side_by_side_workers(["cluster_shards"], 4, 0, "local", 2) == 2
    assert side_by_side_workers(["cluster_shards"], 3, 0, "local", 2) == 1  # a worker's start-up is paid back by 2 partitions
    assert side_by_side_workers(["token_shards", "embedding_shards"], 80, 0, "local", 2) == 1  # their Rust pools fill the cores
    assert side_by_side_workers(["corpus_shards"], 80, 0, "ray", 2) == 1
    assert side_by_side_workers(["corpus_shards"], 80, 1, "local", 16) == 1
    assert side_by_side_workers(["corpus_shards"], 80, 3, "local", 2) == 3
    assert side_by_side_workers([], 80, 0, "local", 2) == 1
    assert side_by_side_workers(["corpus_shards"], 80, 0, "local", 16) == 16  # one a core
    assert side_by_side_workers(["cluster_shards"], 80, 0, "local", 16) == 2  # faiss fills the cores; two runs fill the gaps
    assert side_by_side_workers(["cluster_shards"], 80, 4, "local", 16) == 4  # as configured


def _artifacts(root: Path) -> set[Path]:
    """The data root's files, less the records of the run itself (Dagster's storage, the run's log in
    ``.logs``, the DuckDB file and the recorded config, which names ``partition_workers``) and the
    digest records (``pipeline/storage/atomic.py``: sidecar), which hold modification times, and the run lock (its holder's pid)."""
    from pipeline.storage.atomic import is_sidecar
    from pipeline.storage.lock import RUN_LOCK

    return {p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] not in ("dagster", ".logs")
            and not p.name.startswith("strata.duckdb") and p.name not in ("strata_config.yaml", RUN_LOCK) and not is_sidecar(p)}


def test_side_by_side_writes_the_same_bytes_and_versions(roots):
    (one, runs_one), (two, runs_two) = roots[1], roots[2]
    files = _artifacts(one)
    assert any(str(f).startswith("clusters/shards/") for f in files) and any(str(f).startswith("corpus/shards/") for f in files)
    assert files == _artifacts(two)
    for f in sorted(files):
        assert (one / f).read_bytes() == (two / f).read_bytes(), f
    assert len(runs_one) == len(runs_two) == 2 * N_FILES
    assert {k: v[0] for k, v in runs_one.items()} == {k: v[0] for k, v in runs_two.items()}  # each shard's data version
    # one after another: in this process; side by side: in worker processes, more than one
    assert {pid for _, pid in runs_one.values()} == {os.getpid()}
    pids = {pid for _, pid in runs_two.values()}
    assert os.getpid() not in pids and len(pids) >= 2


def test_side_by_side_lineage_has_a_row_a_partition(roots):
    for root, _ in roots.values():
        with duckdb.connect(str(root / "strata.duckdb"), read_only=True) as con:
            rows = con.execute("SELECT asset, count(DISTINCT partition) FROM lineage WHERE asset IN ('corpus_shards', 'cluster_shards') "
                               "GROUP BY asset ORDER BY asset").fetchall()
        assert rows == [("cluster_shards", N_FILES), ("corpus_shards", N_FILES)]


def test_a_bad_record_in_a_worker_names_its_file_and_line(tmp_path):
    raw = _corpus(tmp_path)
    lines = (raw / "part-2.jsonl").read_text().splitlines()
    lines[4] = lines[4][:-5]  # a truncated JSON object on line 5
    (raw / "part-2.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(StrataInputError) as err:
        _run(_config(tmp_path, "bad", 2, raw), "corpus_shards")
    assert str(err.value).startswith(f"{raw / 'part-2.jsonl'}, line 5: malformed JSON")
