"""``corpus.hf_dataset``: one shard partition per data file of the split, resolved by ``datasets``
from a local folder in the Hub's layout (offline: no Hub request), read like the same files named
by ``corpus.path``; adding a data file runs only its partition, editing one reruns only it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest
import yaml
from helpers import demo_slice

from pipeline.config import CorpusConfig
from pipeline.data.corpus import build_corpus, corpus_units, shard_key, unit_fingerprints
from pipeline.data.hf_hub import unpinned
from pipeline.errors import StrataInputError

REPO = Path(__file__).resolve().parents[1]
README = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: shards/train-*
  - split: validation
    path: shards/valid-*
---
# a dataset card
"""


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch):
    from pipeline.offline import set_offline

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    set_offline(force=True)


def _write(path: Path, recs) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"id": r["id"], "text": r["text"][:2000], "domain": r["domain"]} for r in recs]
    if path.suffix == ".parquet":
        pl.DataFrame(rows).write_parquet(path)
    elif path.suffix == ".csv":
        pl.DataFrame(rows).write_csv(path)
    else:
        pl.DataFrame(rows).write_ndjson(path)


def test_the_hub_layouts_resolve_to_one_shard_per_data_file(tmp_path):
    recs = demo_slice(60)
    plain = tmp_path / "plain"  # the layout datasets resolves by file names alone
    _write(plain / "data" / "train-00000-of-00002.parquet", recs[:20])
    _write(plain / "data" / "train-00001-of-00002.parquet", recs[20:40])
    _write(plain / "data" / "test-00000-of-00001.parquet", recs[40:])
    files = [str((plain / "data" / f"train-0000{i}-of-00002.parquet").resolve()) for i in range(2)]
    assert corpus_units(CorpusConfig(hf_dataset=str(plain))) == files
    assert corpus_units(CorpusConfig(hf_dataset=str(plain), hf_split="test")) == [
        str((plain / "data" / "test-00000-of-00001.parquet").resolve())]

    carded = tmp_path / "carded"  # README.md's YAML configs name the files
    (carded).mkdir()
    (carded / "README.md").write_text(README)
    _write(carded / "shards" / "train-a.jsonl", recs[:30])
    _write(carded / "shards" / "train-b.jsonl", recs[30:50])
    _write(carded / "shards" / "valid-a.jsonl", recs[50:])
    _write(carded / "other" / "train-c.jsonl", recs[:5])  # not in any config: never read
    units = corpus_units(CorpusConfig(hf_dataset=str(carded)))
    assert [shard_key(u).split("@")[0] for u in units] == ["train-a.jsonl", "train-b.jsonl"]
    assert [Path(u).name for u in corpus_units(CorpusConfig(hf_dataset=str(carded), hf_split="validation"))] == ["valid-a.jsonl"]

    # the same documents, ids, hashes and split as corpus.path naming those files
    opts = {"source_field": "domain"}
    (tmp_path / "r1").mkdir(), (tmp_path / "r2").mkdir()
    hub = build_corpus(CorpusConfig(hf_dataset=str(carded), **opts), 0, 0.1, tmp_path / "r1" / "shards", tmp_path / "r1" / "c.parquet")
    direct = build_corpus(CorpusConfig(path=units, **opts), 0, 0.1, tmp_path / "r2" / "shards", tmp_path / "r2" / "c.parquet")
    assert hub.manifest["path"].to_list() == units
    assert hub.manifest.drop("validated").equals(direct.manifest.drop("validated"))
    assert pl.read_parquet(tmp_path / "r1" / "c.parquet").equals(pl.read_parquet(tmp_path / "r2" / "c.parquet"))
    assert hub.report.n_read == 50


def test_a_data_file_of_another_format_is_streamed_by_datasets(tmp_path):
    recs = demo_slice(30)
    _write(tmp_path / "ds" / "data" / "train-0.csv", recs[:10])
    _write(tmp_path / "ds" / "data" / "train-1.csv", recs[10:])
    cfg = CorpusConfig(hf_dataset=str(tmp_path / "ds"), source_field="domain")
    built = build_corpus(cfg, 0, 0.0, tmp_path / "shards", tmp_path / "c.parquet")
    assert built.manifest["n_read"].to_list() == [10, 20]
    got = pl.read_parquet(tmp_path / "c.parquet")
    assert got["id"].to_list() == [r["id"] for r in recs] and set(got["source"]) == {r["domain"] for r in recs}


def test_unresolvable_datasets_are_input_errors_with_the_fix(tmp_path):
    _write(tmp_path / "ds" / "data" / "train.jsonl", demo_slice(3))
    with pytest.raises(StrataInputError, match="no split 'validation'") as err:
        corpus_units(CorpusConfig(hf_dataset=str(tmp_path / "ds"), hf_split="validation"))
    assert err.value.path == "corpus.hf_split" and "train" in err.value.fix
    with pytest.raises(StrataInputError, match="cannot reach the Hugging Face Hub") as err:  # offline: no Hub request
        corpus_units(CorpusConfig(hf_dataset="nobody-here/no-such-dataset"))
    assert "HF_HUB_OFFLINE=0" in err.value.fix and "--local-dir" in err.value.fix


def test_hub_urls_lose_their_pinned_revision():
    """A new commit on the Hub changes the revision datasets pins, not the file's partition key."""
    pinned = "hf://datasets/owner/name@4f2c0d1e9a/data/train-00000-of-00002.parquet"
    assert unpinned(pinned) == "hf://datasets/owner/name/data/train-00000-of-00002.parquet"
    assert unpinned("hf://datasets/owner/name@refs%2Fconvert%2Fparquet/default/train/0000.parquet") == \
        "hf://datasets/owner/name/default/train/0000.parquet"
    assert shard_key(unpinned(pinned)) == shard_key(unpinned(pinned.replace("4f2c0d1e9a", "77aa00bb")))


def _strata(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "assets.cli", *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=600, check=False)


@pytest.mark.integration
def test_adding_or_editing_a_data_file_runs_only_its_partition(tmp_path):
    recs = demo_slice(90)
    ds = tmp_path / "ds"
    _write(ds / "data" / "train-00000-of-00002.parquet", recs[:30])
    _write(ds / "data" / "train-00001-of-00002.parquet", recs[30:60])
    root = tmp_path / "root"
    cfg = {"data_root": str(root), "corpus": {"hf_dataset": str(ds), "source_field": "domain"}, "heldout_fraction": 0.05}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))

    def run() -> dict[str, int]:
        proc = _strata("run", "--config", str(path), "--select", "corpus_shards")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        with duckdb.connect(str(root / "strata.duckdb"), read_only=True) as con:
            rows = con.sql("SELECT partition, count(*) FROM lineage WHERE asset = 'corpus_shards' GROUP BY partition").fetchall()
        return {p.split("@")[0]: n for p, n in rows}

    assert run() == {"train-00000-of-00002.parquet": 1, "train-00001-of-00002.parquet": 1}
    _write(ds / "data" / "train-00002-of-00002.parquet", recs[60:])  # a new data file: only its partition runs
    assert run() == {"train-00000-of-00002.parquet": 1, "train-00001-of-00002.parquet": 1, "train-00002-of-00002.parquet": 1}
    _write(ds / "data" / "train-00001-of-00002.parquet", recs[30:59])  # an edited one: only it reruns
    assert run() == {"train-00000-of-00002.parquet": 1, "train-00001-of-00002.parquet": 2, "train-00002-of-00002.parquet": 1}
    assert set(unit_fingerprints(CorpusConfig(hf_dataset=str(ds), source_field="domain"))) == {
        str((ds / "data" / f"train-0000{i}-of-00002.parquet").resolve()) for i in range(3)}
