"""The asset graph on a sharded corpus: appending or editing a shard recomputes only that shard's
corpus, tokens and embeddings (read from the Dagster instance's materialization events); an append
keeps the centroids and assigns only the new shard, an edit retrains them; every token is
conserved across shards (the blocking checks pass in every run)."""

from __future__ import annotations

import os
import subprocess
import sys

import dagster as dg
import numpy as np
import polars as pl
import pytest
import yaml

from helpers import demo_slice
from pipeline.data.tokenizer import load_tokenizer
from pipeline.data.tokens import open_tokens, tokenize_documents
from pipeline.represent.embeddings import default_model_path, embed
from pipeline.storage.layout import Layout

pytestmark = pytest.mark.integration

def _materialize(cfg_path, cwd) -> None:
    """``strata run --select '*sequences'`` (blocking checks, e.g. token conservation, fail it)."""
    env = {**os.environ, "DAGSTER_HOME": ""}
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(cfg_path), "--select", "*sequences"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _shards_run(instance: dg.DagsterInstance, after: int) -> tuple[list[str], int]:
    """The corpus_shards partitions materialized since event ``after``, and the newest event id."""
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("corpus_shards"), after_storage_id=after),
                                              limit=100).records
    return sorted(r.partition_key for r in records), max([after] + [r.storage_id for r in records])


def _latest(instance: dg.DagsterInstance, asset: str) -> dict:
    event = instance.get_latest_materialization_event(dg.AssetKey(asset))
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def _write_shard(path, recs) -> None:
    pl.DataFrame([{"id": r["id"], "text": r["text"][:3000], "domain": r["domain"]} for r in recs]).write_parquet(path)


def test_append_and_edit_recompute_only_that_shard(tmp_path, request):
    recs = demo_slice(200)
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(3):
        _write_shard(shards / f"part-{i}.parquet", recs[i * 50 : (i + 1) * 50])
    cfg = {"data_root": str(tmp_path / "root"), "corpus": {"path": str(shards), "source_field": "domain"},
           "tokenizer": default_model_path(), "embed_method": "shallow", "embed_max_tokens": 32,
           "k": 4, "seq_len": 128, "heldout_fraction": 0.05, "strategies": ["random"]}
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    root = request.config.rootpath
    layout = Layout(tmp_path / "root")

    _materialize(cfg_path, root)
    instance = dg.DagsterInstance.from_config(str(layout.root / "dagster"))
    keys = sorted(instance.get_dynamic_partitions("corpus_shard"))
    assert [k.split("@")[0] for k in keys] == [f"part-{i}.parquet" for i in range(3)]
    ran, mark = _shards_run(instance, 0)
    assert ran == keys
    assert _latest(instance, "tokens")["shards_computed"] == 3
    assert _latest(instance, "embeddings")["from_token_store"] is True
    assert _latest(instance, "clusters")["centroids"] == "trained"
    first_centroids = np.load(layout.centroids)

    _write_shard(shards / "part-3.parquet", recs[150:])  # append a fourth shard
    _materialize(cfg_path, root)
    ran, mark = _shards_run(instance, mark)
    assert [k.split("@")[0] for k in ran] == ["part-3.parquet"]  # only the new shard's partition ran
    assert (_latest(instance, "corpus")["shards_validated"], _latest(instance, "corpus")["shards_reused"]) == (0, 4)  # the partition did it
    for asset in ("tokens", "embeddings"):
        meta = _latest(instance, asset)
        assert (meta["shards_computed"], meta["shards_reused"]) == (1, 3), (asset, meta)
    meta = _latest(instance, "clusters")  # appended only: centroids kept, only the new shard assigned
    assert (meta["centroids"], meta["assign_shards_computed"], meta["assign_shards_reused"]) == ("kept", 1, 3), meta
    np.testing.assert_array_equal(np.load(layout.centroids), first_centroids)

    edited = recs[50:100]
    edited[7] = {**edited[7], "text": "An edited document about nothing in particular. " + edited[7]["text"]}
    _write_shard(shards / "part-1.parquet", edited)  # edit shard 2
    _materialize(cfg_path, root)
    ran, mark = _shards_run(instance, mark)
    assert [k.split("@")[0] for k in ran] == ["part-1.parquet"]
    for asset in ("tokens", "embeddings"):
        assert (_latest(instance, asset)["shards_computed"], _latest(instance, asset)["shards_reused"]) == (1, 3), asset
    meta = _latest(instance, "clusters")  # a shard it was trained on changed: retrained, everything reassigned
    assert (meta["centroids"], meta["assign_shards_computed"]) == ("trained", 4), meta

    # The reused + recomputed store equals tokenizing and embedding the final corpus from scratch.
    texts = pl.read_parquet(layout.corpus)["text"].to_list()
    flat, off = tokenize_documents(load_tokenizer(default_model_path()), texts, progress=False)
    tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
    np.testing.assert_array_equal(np.asarray(tokens), flat)
    np.testing.assert_array_equal(offsets, off)
    np.testing.assert_array_equal(np.load(layout.embeddings), embed(texts, "shallow", "", 32, progress=False))
    manifest = pl.read_parquet(layout.shards)
    assert manifest.height == 4 and manifest["n_docs"].sum() == len(texts)
    docs = pl.read_parquet(layout.documents)
    assert docs["doc_id"].to_list() == list(range(len(texts)))
    assert _latest(instance, "sequences")["rows/sequences"] > 0  # token_conservation passed in every run (SCRIPT)
