"""End to end on object storage (issue 44's "done when"), against the test S3 server: a small
`strata run` with ``corpus.path: s3://…`` (the ``exports`` asset writing to an ``s3://`` prefix),
an appended object that runs only its own shard partition, `strata export` of greedy to
``s3://…`` read back position for position by MosaicML streaming and HF datasets from the
endpoint, and no credential in any artifact."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest
import yaml
from helpers import demo_slice, small_graph_config

REPO = Path(__file__).resolve().parents[1]


def _strata(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "assets.cli", *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=600, check=False)


def _lines(records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


@pytest.mark.integration
def test_corpus_and_exports_on_s3_end_to_end(s3_bucket, tmp_path, monkeypatch):
    from test_export import IMPORT_STREAMING

    docs = demo_slice(200)
    s3_bucket.put("corpus/part-0.jsonl", _lines(docs[:100]))
    s3_bucket.put("corpus/part-1.jsonl.gz", gzip.compress(_lines(docs[100:180])))
    root = tmp_path / "root"
    cfg = {**small_graph_config(tmp_path / "unused"), "data_root": str(root), "export": {"formats": ["hf"],
           "dir": f"{s3_bucket.url}/asset-exports"}}
    cfg["corpus"]["path"] = f"{s3_bucket.url}/corpus/"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))

    first = _strata("run", "--config", str(path), "--select", "*exports")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    objects = s3_bucket.fs().find(f"{s3_bucket.name}/asset-exports/")
    assert f"{s3_bucket.name}/asset-exports/greedy/hf/meta.json" in objects  # the exports asset wrote to the bucket

    s3_bucket.put("corpus/part-2.jsonl", _lines(docs[180:]))  # an appended object: only its partition runs
    second = _strata("run", "--config", str(path), "--select", "corpus_shards")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    with duckdb.connect(str(root / "strata.duckdb"), read_only=True) as con:
        runs = con.sql("SELECT partition, count(*) FROM lineage WHERE asset = 'corpus_shards' "
                       "GROUP BY partition ORDER BY partition").fetchall()
    assert [(p.split("@")[0], n) for p, n in runs] == [("part-0.jsonl", 1), ("part-1.jsonl.gz", 1), ("part-2.jsonl", 1)]

    G = cfg["batch_size"]
    for fmt in ("mds", "hf"):
        out = _strata("export", "--strategy", "greedy", "--format", fmt, "--out", f"{s3_bucket.url}/greedy-{fmt}",
                      "--config", str(path))
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.export import open_stream
    from pipeline.storage.layout import Layout

    layout = Layout(root)
    tok = load_tokenizer(layout.tokenizer)
    stream = open_stream(layout, "greedy", eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    n = stream.n_sequences // G * G
    every = np.concatenate([rows for _, rows in stream.chunks()])
    want = every[:n]  # mds holds whole global batches only
    assert n > 0

    exec(IMPORT_STREAMING, {})
    from streaming.base import StreamingDataset

    ds = StreamingDataset(remote=f"{s3_bucket.url}/greedy-mds", local=str(tmp_path / "mds-cache"), shuffle=False,
                          batch_size=G, num_canonical_nodes=1)
    assert ds.num_samples == n
    np.testing.assert_array_equal(np.stack([ds.get_item(i)["input_ids"] for i in range(n)]), want)
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # datasets refuses every remote URL offline
    hf = datasets.load_dataset("parquet", data_files=f"{s3_bucket.url}/greedy-hf/data/*.parquet", split="train",
                               storage_options={"key": s3_bucket.key_id, "secret": s3_bucket.secret,
                                                "endpoint_url": s3_bucket.server.endpoint},
                               cache_dir=str(tmp_path / "hf-cache"))
    np.testing.assert_array_equal(np.asarray(hf["input_ids"]), every)
    meta = json.loads(s3_bucket.fs().cat(f"{s3_bucket.name}/greedy-hf/meta.json"))
    assert meta["strategy"] == "greedy" and meta["lineage"]["ordering"] == "orderings/greedy.parquet"

    # no credential anywhere: the data root (DuckDB, Dagster's storage and logs, meta.json), the
    # commands' output, the objects Strata wrote
    secrets = [s3_bucket.secret.encode(), s3_bucket.key_id.encode()]
    for f in (p for p in root.rglob("*") if p.is_file()):
        data = f.read_bytes()
        assert not any(s in data for s in secrets), f
    for proc in (first, second):
        assert not any(s.decode() in proc.stdout + proc.stderr for s in secrets)
    for key in s3_bucket.fs().find(s3_bucket.name):
        if not key.split("/")[1] == "corpus":
            assert not any(s in s3_bucket.fs().cat(key) for s in secrets), key
