"""The clean stage in the graph: a WikiText paragraph planted in a training document and planted
exact and near duplicates leave training, their tokens accounted by reason in the token
conservation check, and the orderings never hold them."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import duckdb
import numpy as np
import polars as pl
import pytest
import yaml
from helpers import DATA, demo_slice, small_graph_config

WIKITEXT = DATA / "eval" / "wikitext" / "wiki.test.raw"


def _corpus(path) -> str:
    """150 demo documents, a long text and its near copy (two words edited), an exact copy (case and
    spacing changed) of a demo document, and a WikiText-2 test paragraph inside a document; the paragraph."""
    from pipeline.data.wikitext import read_articles

    if not WIKITEXT.is_file():
        pytest.skip(f"WikiText-2 raw test file not found at {WIKITEXT}")
    docs = demo_slice(150)
    rows = [{"id": f"d{i}", "text": d["text"], "domain": d["domain"]} for i, d in enumerate(docs)]
    para = max(read_articles(WIKITEXT)[3].split("\n"), key=len).strip()
    long = " ".join(d["text"] for d in demo_slice(400, stride=29)[200:])
    words = long.split()[:400]
    edited = list(words)
    edited[50], edited[300] = "zzedit", "zzedit"
    rows += [{"id": "near-a", "text": " ".join(words), "domain": "web"}, {"id": "near-b", "text": " ".join(edited), "domain": "web"},
             {"id": "exact", "text": "  " + rows[7]["text"].upper() + "  ", "domain": rows[7]["domain"]},
             {"id": "wiki", "text": "Some preface words here. " + para + " And an ending.", "domain": "web"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return para


def test_planted_contamination_and_duplicates_leave_training_accounted(tmp_path):
    from pipeline.clean.removals import packed_stream
    from pipeline.packing.pack import conservation
    from pipeline.storage.layout import Layout

    para = _corpus(tmp_path / "corpus.jsonl")
    cfg = small_graph_config(tmp_path / "corpus.jsonl") | {
        "data_root": str(tmp_path / "root"), "wikitext_path": str(WIKITEXT), "heldout_fraction": 0.0,
        "strategies": ["random", "duplicate_separated"], "dedup": {"semantic": False}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(tmp_path / "cfg.yaml"), "--select", "*orderings"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]  # token_conservation is a blocking check: it passed
    layout = Layout(tmp_path / "root")
    ids = pl.read_parquet(layout.corpus, columns=["doc_id", "id"])
    table = pl.read_parquet(layout.inside("clean", "documents.parquet")).join(ids, on="doc_id")
    removed = dict(table.filter(pl.col("removed").is_not_null()).select("id", "removed").iter_rows())
    assert removed == {"near-b": "near", "exact": "exact", "wiki": "contaminated"}, removed
    assert table.filter(pl.col("id") == "wiki")["contaminated"].to_list() == ["wikitext"]
    stream = np.diff(np.load(layout.doc_offsets))
    wiki = int(table.filter(pl.col("id") == "wiki")["doc_id"][0])
    assert stream[wiki] > len(re.findall(r"\w+", para))  # the paragraph's tokens are the document's
    kept, by_reason = packed_stream(layout, stream)
    assert by_reason["contaminated"] == stream[wiki] and kept[wiki] == 0
    segments = pl.read_parquet(layout.segments)
    acc = conservation(segments, kept, cfg["seq_len"])
    assert acc["ok"] and acc["tokens_in"] + sum(by_reason.values()) == int(stream.sum())
    gone = {int(d) for d in table.filter(pl.col("removed").is_not_null())["doc_id"]}
    assert not gone & set(segments["doc_id"].to_list())
    assert not gone & set(pl.read_parquet(layout.ordering_segments("duplicate_separated"))["doc_id"].to_list())
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        stats = dict(con.execute("SELECT metric, value FROM packing_stats").fetchall())
        contam = con.execute("SELECT eval_set, doc_id, n_tokens FROM contamination").fetchall()
        kinds = dict(con.execute("SELECT dup_kind, count(*) FROM duplicates GROUP BY dup_kind").fetchall())
    assert stats["tokens_removed_contaminated"] == stream[wiki] and contam == [("wikitext", wiki, int(stream[wiki]))]
    assert kinds == {"exact": 2, "near": 2}
