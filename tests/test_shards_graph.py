"""The asset graph on a sharded corpus: appending or editing a shard runs only that shard's
partitions of corpus_shards, token_shards and embedding_shards (read from the Dagster instance's
materialization events); an append keeps the centroids and runs only the new cluster_shards
partition, an edit retrains them and reassigns every shard; documents the corpus drops (a
duplicate id in another shard) are left out of the gathered stores; every token is conserved
across shards (the blocking checks pass in every run)."""

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

from pipeline.data.shard_docs import corpus_texts, kept_rows, manifest_shards
from pipeline.data.tokenizer import load_tokenizer
from pipeline.data.tokens import open_tokens, tokenize_documents
from pipeline.represent.clusters import assign_transformed, load_model
from pipeline.represent.embedding_index import open_embeddings
from pipeline.represent.embeddings import default_model_path, embed
from pipeline.storage.layout import Layout

pytestmark = pytest.mark.integration

def _materialize(cfg_path, cwd) -> None:
    """``strata run --select '*sequences'`` (blocking checks, e.g. token conservation, fail it)."""
    env = {**os.environ, "DAGSTER_HOME": ""}
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(cfg_path), "--select", "*sequences"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


SHARD_ASSETS = ("corpus_shards", "token_shards", "embedding_shards", "cluster_shards", "clean_shards")


def _shards_run(instance: dg.DagsterInstance, after: int) -> tuple[dict[str, list[str]], int]:
    """The partitions (file names) of each per-shard asset materialized since event ``after``, and the newest event id."""
    ran, mark = {}, after
    for asset in SHARD_ASSETS:
        records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), after_storage_id=after),
                                                  limit=100).records
        ran[asset] = sorted(r.partition_key.split("@")[0] for r in records)
        mark = max([mark] + [r.storage_id for r in records])
    return ran, mark


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
    dup = {**recs[0], "text": "A different text under an id the first shard already has. " + recs[120]["text"]}
    _write_shard(shards / "part-2.parquet", recs[100:125] + [dup] + recs[125:150])  # dropped by `corpus` (on_error: skip)
    cfg = {"data_root": str(tmp_path / "root"), "corpus": {"path": str(shards), "source_field": "domain", "on_error": "skip"},
           "tokenizer": default_model_path(), "embed_method": "shallow", "embed_max_tokens": 32,
           "k": 4, "seq_len": 128, "heldout_fraction": 0.05, "strategies": ["random"], "dedup": {"semantic": False}}
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    root = request.config.rootpath
    layout = Layout(tmp_path / "root")
    names = [f"part-{i}.parquet" for i in range(4)]

    _materialize(cfg_path, root)
    instance = dg.DagsterInstance.from_config(str(layout.root / "dagster"))
    keys = sorted(instance.get_dynamic_partitions("corpus_shard"))
    assert [k.split("@")[0] for k in keys] == names[:3]
    ran, mark = _shards_run(instance, 0)
    assert ran == {a: names[:3] for a in SHARD_ASSETS}  # every stage of every shard ran as its own partition
    assert _latest(instance, "tokens")["shards_computed"] == 0  # the gathers found every shard's files
    assert _latest(instance, "embedding_shards")["from_token_store"] is True
    assert _latest(instance, "centroids")["centroids"] == "trained"
    assert _latest(instance, "corpus")["rows/skipped"] == 1
    first_centroids = np.load(layout.centroids)

    longest = max(range(60, 100), key=lambda i: len(recs[i]["text"][:3000]))
    words = recs[longest]["text"][:3000].split()
    words[len(words) // 2] = "zzedited"
    copies = [{**recs[3], "id": "copy-exact", "text": "  " + recs[3]["text"][:3000].upper()},  # of a document of part-0
              {**recs[longest], "id": "copy-near", "text": " ".join(words)}]  # of part-1, one word edited
    _write_shard(shards / "part-3.parquet", recs[150:175] + copies + recs[175:])  # append a fourth shard
    _materialize(cfg_path, root)
    ran, mark = _shards_run(instance, mark)
    assert ran == {a: ["part-3.parquet"] for a in SHARD_ASSETS}, ran  # only the new shard's partitions ran; centroids kept
    assert _latest(instance, "clean")["shards_scanned_here"] == 0  # the gather read the partitions' scans
    ids = pl.read_parquet(layout.corpus, columns=["doc_id", "id"])
    table = pl.read_parquet(layout.inside("clean", "documents.parquet")).join(ids, on="doc_id")
    kinds = dict(table.filter(pl.col("id").str.starts_with("copy-")).select("id", "dup_kind").iter_rows())
    assert kinds == {"copy-exact": "exact", "copy-near": "near"}, kinds  # duplicates across shards are found
    assert _latest(instance, "centroids")["centroids"] == "kept"
    for asset in ("corpus", "tokens", "embeddings"):
        meta = _latest(instance, asset)
        assert meta.get("shards_validated", meta.get("shards_computed")) == 0, (asset, meta)
    np.testing.assert_array_equal(np.load(layout.centroids), first_centroids)

    edited = recs[50:100]
    edited[7] = {**edited[7], "text": "An edited document about nothing in particular. " + edited[7]["text"]}
    _write_shard(shards / "part-1.parquet", edited)  # edit shard 2
    _materialize(cfg_path, root)
    ran, mark = _shards_run(instance, mark)
    for a in (*SHARD_ASSETS[:3], "clean_shards"):
        assert ran[a] == ["part-1.parquet"], ran
    assert _latest(instance, "centroids")["centroids"] == "trained"  # a shard it was trained on changed: retrained
    assert ran["cluster_shards"] == names, ran  # a new model: every shard reassigned

    # The reused + recomputed stores equal tokenizing and embedding the final corpus from scratch.
    texts = pl.concat(list(corpus_texts(layout.corpus, pl.read_parquet(layout.shards), layout.shard_dir("corpus")))).to_list()
    assert dup["text"] not in texts
    dropped = [kept_rows(layout.corpus, row, shard) is not None
               for row, shard in manifest_shards(pl.read_parquet(layout.shards), layout.shard_dir("corpus"))]
    assert dropped == [False, False, True, False]  # the gathers took part-2's kept rows only
    flat, off = tokenize_documents(load_tokenizer(default_model_path()), texts, progress=False)
    tokens, offsets = open_tokens(layout.tokens, layout.doc_offsets)
    np.testing.assert_array_equal(np.asarray(tokens), flat)
    np.testing.assert_array_equal(offsets, off)
    np.testing.assert_array_equal(np.asarray(open_embeddings(layout)), embed(texts, "shallow", "", 32, progress=False))
    manifest = pl.read_parquet(layout.shards)
    assert manifest.height == 4 and manifest["n_docs"].sum() == len(texts)
    docs = pl.read_parquet(layout.documents)
    assert docs["doc_id"].to_list() == list(range(len(texts)))
    np.testing.assert_array_equal(docs["n_tokens"].to_numpy(), np.diff(off) - 1)
    cents, transform, _ = load_model(layout.inside("clusters", "model"))
    assign = assign_transformed(cents, transform.spherical, transform(np.array(open_embeddings(layout))))
    np.testing.assert_array_equal(pl.read_parquet(layout.clusters)["cluster"].to_numpy(), assign)
    assert _latest(instance, "sequences")["rows/sequences"] > 0  # token_conservation passed in every run (SCRIPT)
    _same_clean_as_one_pass(layout, texts)


def _same_clean_as_one_pass(layout: Layout, texts: list[str]) -> None:
    """The clean table gathered from reused and recomputed per-shard scans equals one pass of the
    library over the final corpus's texts (exact hashes, near pairs, the held-out n-grams)."""
    from pipeline.clean.decontam import EvalNgrams, common_grams, eval_sets
    from pipeline.clean.exact import exact_representatives, text_hashes
    from pipeline.clean.near import near_pairs
    from pipeline.clean.plan import plan
    from pipeline.config import resolve_config

    cfg = resolve_config(None, str(layout.root))
    rep = exact_representatives(text_hashes(texts))
    firsts = np.flatnonzero(rep == np.arange(len(texts)))
    d = cfg.dedup
    near, _ = near_pairs([(firsts.tolist(), [texts[i] for i in firsts])], d.near_threshold, d.near_num_perm, d.near_ngram, cfg.seed + 1)
    evals = EvalNgrams.build(eval_sets(cfg, layout.heldout), cfg.decontam.ngram, common_share=cfg.decontam.common_share)
    assert evals.names == ("heldout",)
    found = evals.hits(texts)[0]
    found = found[~common_grams(found, evals.hashes[0].size, len(texts), cfg.decontam.common_share, evals.units_with[0])[found[:, 1]]]
    flags = (np.bincount(found[:, 0], minlength=len(texts)) >= cfg.decontam.min_overlap)[:, None]
    expected = plan(len(texts), rep, near, np.zeros((0, 2), np.int64), flags, evals.names, d.action, True)
    got = pl.read_parquet(layout.inside("clean", "documents.parquet"))
    assert got.equals(expected), (got.filter(pl.col("dup_group") >= 0), expected.filter(pl.col("dup_group") >= 0))
    assert expected["dup_group"].max() >= 0  # the comparison has duplicates to find
