"""Sharded corpora: files, directories, globs and lists of Parquet / JSONL(.gz/.zst) shards, read
as validated batches; errors name the shard; validated shards are reused by content."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import built_corpus, demo_slice

from pipeline.config import CorpusConfig, config_from_dict
from pipeline.data.corpus import build_corpus
from pipeline.data.shard_docs import read_docs
from pipeline.data.shards import discover_shards
from pipeline.errors import StrataInputError


def _write(path: Path, records: list, kind: str) -> Path:
    if kind == "parquet":
        pl.DataFrame(records).write_parquet(path)
        return path
    lines = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode()
    if kind == "gz":
        path.write_bytes(gzip.compress(lines))
    elif kind == "zst":
        with pa.output_stream(str(path), compression="zstd") as fh:
            fh.write(lines)
    else:
        path.write_bytes(lines)
    return path


@pytest.fixture
def shards(tmp_path) -> tuple[Path, list[dict]]:
    recs = [{"id": r["id"], "text": r["text"], "source": r["domain"]} for r in demo_slice(80)]
    d = tmp_path / "shards"
    (d / "sub").mkdir(parents=True)
    _write(d / "a.parquet", recs[:20], "parquet")
    _write(d / "b.jsonl.gz", recs[20:40], "gz")
    _write(d / "sub" / "c.jsonl.zst", recs[40:60], "zst")
    _write(d / "d.jsonl", recs[60:], "plain")
    (d / "notes.txt").write_text("not a shard")
    return d, recs


def test_directory_glob_and_list_read_every_format_in_path_order(shards, tmp_path):
    d, recs = shards
    expected = [r["id"] for r in recs[:40] + recs[60:] + recs[40:60]]  # a, b, d, sub/c (sorted paths)
    for spec in (str(d), str(d / "**" / "*.*"), [str(d / "a.parquet"), str(d / "b.jsonl.gz"), str(d / "d.jsonl"), str(d / "sub")]):
        df, report = built_corpus(CorpusConfig(path=spec), tmp_path)
        assert df["id"].to_list() == expected and report.n_read == 80
        assert df["source"].to_list()[:3] == [r["source"] for r in recs[:3]]
    assert [p.name for p in discover_shards(str(d))] == ["a.parquet", "b.jsonl.gz", "d.jsonl", "c.jsonl.zst"]
    assert config_from_dict({"corpus": {"path": [str(d)]}}).corpus.path == [str(d)]


def test_no_shards_and_unknown_format_are_clear(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(StrataInputError, match="no corpus shards match"):
        discover_shards(str(tmp_path / "*.parquet"))
    with pytest.raises(StrataInputError, match="unknown corpus format"):
        discover_shards(str(tmp_path / "x.csv"))
    with pytest.raises(StrataInputError, match="impossible"):
        config_from_dict({"corpus": {"path": []}})


def test_bad_record_in_shard_2_names_that_shard_and_line(tmp_path, tmp_path_factory):
    good = [{"id": f"d{i}", "text": f"document {i}"} for i in range(6)]
    _write(tmp_path / "s1.jsonl", good[:3], "plain")
    bad = _write(tmp_path / "s2.jsonl.zst", [good[3], '{"id": "x", "text": "unterminated', good[4]], "zst")
    with pytest.raises(StrataInputError) as err:
        built_corpus(CorpusConfig(path=str(tmp_path)), tmp_path_factory.mktemp("build"))
    assert str(bad) in str(err.value) and "line 2: malformed JSON" in str(err.value) and "Fix:" in str(err.value)

    pq_dir = tmp_path / "pq"
    pq_dir.mkdir()
    _write(pq_dir / "s1.parquet", good[:3], "parquet")
    bad_pq = _write(pq_dir / "s2.parquet", [good[3], {"id": "e", "text": "  "}, good[4]], "parquet")
    with pytest.raises(StrataInputError) as err:
        build_corpus(CorpusConfig(path=str(pq_dir)), 0, 0.0, tmp_path / "work", tmp_path / "corpus.parquet")
    assert str(bad_pq) in str(err.value) and "line 2: document text is empty" in str(err.value)


def test_skip_counts_per_shard_and_duplicates_across_shards(tmp_path, tmp_path_factory):
    _write(tmp_path / "s1.jsonl", [{"id": "a", "text": "one"}, "{broken", {"id": "b", "text": "two"}], "plain")
    _write(tmp_path / "s2.parquet", [{"id": "a", "text": "again"}, {"id": "c", "text": ""}, {"id": "d", "text": "four"}], "parquet")
    cfg = CorpusConfig(path=str(tmp_path), on_error="skip")
    df, report = built_corpus(cfg, tmp_path_factory.mktemp("build"))
    assert df["id"].to_list() == ["a", "b", "d"]
    assert report.skipped_by_shard == {str(tmp_path / "s1.jsonl"): 1, str(tmp_path / "s2.parquet"): 2}
    dup = tmp_path / "dup"
    dup.mkdir()
    _write(dup / "s1.jsonl", [{"id": "a", "text": "one"}, {"id": "b", "text": "two"}], "plain")
    _write(dup / "s2.parquet", [{"id": "c", "text": "three"}, {"id": "a", "text": "again"}], "parquet")
    with pytest.raises(StrataInputError,
                       match=r"s2\.parquet: duplicate document id 'a' \(records \[s1.jsonl line 1, s2.parquet line 2\]\)"):
        built_corpus(CorpusConfig(path=str(dup / "s*")), tmp_path)
    with pytest.raises(StrataInputError, match=r"s2\.parquet: duplicate document id 'a'"):
        build_corpus(CorpusConfig(path=str(dup)), 0, 0.0, tmp_path / "work", tmp_path / "corpus.parquet")


def test_build_corpus_streams_and_reuses_unchanged_shards(shards, tmp_path):
    d, recs = shards
    cfg = CorpusConfig(path=str(d))
    work, out = tmp_path / "work", tmp_path / "corpus.parquet"
    first = build_corpus(cfg, 0, 0.1, work, out, batch_rows=7)
    assert first.validated == 4 and first.reused == 0
    corpus = pl.read_parquet(out)
    ref, _ = built_corpus(cfg, tmp_path)
    assert corpus.height + first.n_heldout == ref.height == 80
    assert corpus["doc_id"].to_list() == list(range(corpus.height))
    m = first.manifest
    assert m["n_docs"].sum() == corpus.height and (m["doc_start"] == m["n_docs"].cum_sum() - m["n_docs"]).all()
    parquet = pq.ParquetFile(out)
    for row in m.to_dicts():  # each shard's documents are its own row groups; read_docs finds them by doc id
        want = np.arange(row["doc_start"], row["doc_start"] + row["n_docs"])
        groups = list(range(row["row_group_start"], row["row_group_end"]))
        np.testing.assert_array_equal(pl.from_arrow(parquet.read_row_groups(groups, columns=["doc_id"]))["doc_id"].to_numpy(), want)
        np.testing.assert_array_equal(read_docs(out, int(want[0]), int(want[-1]) + 1, ["doc_id"])["doc_id"].to_numpy(), want)
    before = out.read_bytes()
    again = build_corpus(cfg, 0, 0.1, work, out, batch_rows=7)
    assert again.validated == 0 and again.reused == 4 and out.read_bytes() == before

    _write(d / "e.parquet", [{"id": "new", "text": "an appended document", "source": "web"}], "parquet")
    grown = build_corpus(cfg, 0, 0.1, work, out, batch_rows=7)
    assert grown.validated == 1 and grown.reused == 4
    assert len(list(work.glob("*.parquet"))) == 5
