"""Bad input stops with a message naming the file, the line and the fix."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from helpers import built_corpus

from pipeline.config import CorpusConfig, config_from_dict
from pipeline.data.corpus import (
    SHARD_FILE_COLUMNS,
    ZSTD_LEVEL,
    content_hashes,
    heldout_keys,
    heldout_mask,
    read_unit,
    validate_unit,
)
from pipeline.data.shards import ShardReport
from pipeline.errors import StrataInputError

GOOD = {"id": "a", "text": "hello world", "source": "web"}


def _read(path, **kw):
    return built_corpus(CorpusConfig(path=str(path), **kw), Path(path).parent)


def test_reads_jsonl_and_gz(write_jsonl, tmp_path):
    path = write_jsonl([GOOD, {"id": "b", "text": "second doc"}])
    df, report = _read(path)
    assert df["id"].to_list() == ["a", "b"] and df["source"].to_list() == ["web", "corpus"]
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert _read(gz)[0].equals(df)


def test_missing_file(tmp_path):
    with pytest.raises(StrataInputError, match="not found.*Fix: set corpus.path"):
        _read(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    "bad, message",
    [
        ('{"id": "x", "text": "unterminated', "line 2: malformed JSON"),
        ('{"id": "x", "body": "no text"}', "line 2: missing text field 'text'"),
        ('{"id": "x", "text": 42}', "line 2: text field 'text' is int"),
        ('{"id": "x", "text": "   "}', "line 2: document text is empty"),
        ('["not", "an", "object"]', "line 2: record is not a JSON object"),
    ],
)
def test_bad_lines_name_file_line_and_fix(write_jsonl, bad, message):
    path = write_jsonl([GOOD, bad])
    with pytest.raises(StrataInputError) as err:
        _read(path)
    assert str(path) in str(err.value) and message in str(err.value) and "Fix:" in str(err.value)


def test_skip_policy_counts_what_it_skipped(write_jsonl):
    path = write_jsonl([GOOD, "{broken", {"id": "c", "text": ""}, {"id": "d", "text": "ok text"}])
    df, report = _read(path, on_error="skip")
    assert df["id"].to_list() == ["a", "d"]
    assert [line for line, _ in report.skipped] == [2, 3]


def test_invalid_utf8(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "caf\xe9"}\n')
    with pytest.raises(StrataInputError, match="line 2: invalid UTF-8"):
        _read(path)


def test_duplicate_ids(write_jsonl):
    with pytest.raises(StrataInputError, match="duplicate document id 'a'"):
        _read(write_jsonl([GOOD, GOOD]))


def test_duplicate_ids_skipped_keep_the_first(write_jsonl):
    df, report = _read(write_jsonl([GOOD, {"id": "b", "text": "other"}, {**GOOD, "text": "again"}]), on_error="skip")
    assert df["id"].to_list() == ["a", "b"] and df["text"][0] == "hello world"
    assert report.skipped == [(3, "duplicate document id 'a'")]


def test_empty_corpus(write_jsonl):
    with pytest.raises(StrataInputError, match="no usable documents"):
        _read(write_jsonl([]))


@pytest.mark.parametrize("key, value", [("seq_len", 0), ("seq_len", 1), ("k", 0), ("heldout_fraction", 0.9)])
def test_impossible_parameters(key, value):
    with pytest.raises(StrataInputError, match=f"{key}={value!r} is impossible"):
        config_from_dict({key: value})


def test_unknown_config_key():
    with pytest.raises(StrataInputError, match="unknown config key"):
        config_from_dict({"seqlen": 128})


def test_builtin_corpus_is_deterministic():
    from pipeline.data.builtin_corpus import builtin_documents

    a, b = builtin_documents(300), builtin_documents(300)
    assert a == b and len(a) == 300
    assert {"code", "docs"} <= {d[2] for d in a}


TEXTS = ["hello world", "café crème brûlée", "日本語のテキスト", "emoji 😀 family 👩‍👩‍👧 flag 🇫🇷", "e\u0301 combining",
         "tab\tnewline\n", "x" * (1 << 20) + "é" * 1000 + "😀"]  # the last one over 1 MB


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _key(content_hash: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{content_hash}".encode()).digest()[:8], "big")


def test_content_hashes_and_heldout_split_match_hashlib():
    texts = TEXTS + [f"document {i} ✓" for i in range(3000)]
    hashes = content_hashes(pl.Series(texts))
    assert hashes.to_list() == [_sha256(t) for t in texts]
    for seed in (0, 7, 2**40 + 1):
        keys = [_key(h, seed) for h in hashes]
        assert heldout_keys(hashes, seed).tolist() == keys
        for fraction in (0.02, 0.5):
            assert heldout_mask(hashes, fraction, seed).tolist() == [k / 2**64 < fraction for k in keys]
    assert heldout_mask(pl.Series([], dtype=pl.String), 0.1, 0).size == 0


def _shard(tmp_path: Path, bad_row: int | None = None) -> Path:
    docs = [{"id": f"d{i}", "text": f"{TEXTS[i % len(TEXTS)]} #{i}", "source": "web"} for i in range(60)]
    if bad_row is not None:
        docs[bad_row - 1]["text"] = "   "
    path = tmp_path / "s.parquet"
    pl.DataFrame(docs).write_parquet(path)
    return path


def _serial_reference(shard: Path, cfg: CorpusConfig, fraction: float, out: Path, batch_rows: int) -> ShardReport:
    """The validated shard written batch after batch in one thread, split by plain hashlib."""
    report = ShardReport(str(shard))
    writer = None
    for batch in read_unit(str(shard), cfg, report, batch_rows):
        hashes = [_sha256(t) for t in batch["text"]]
        held = [_key(h, 0) / 2**64 < fraction for h in hashes]
        table = batch.with_columns(content_hash=pl.Series(hashes), heldout=pl.Series(held)).select(SHARD_FILE_COLUMNS).to_arrow()
        writer = writer or pq.ParquetWriter(out, table.schema, compression="zstd", compression_level=ZSTD_LEVEL, write_statistics=False)
        writer.write_table(table, row_group_size=len(table))
    writer.close()
    return report


@pytest.mark.parametrize("batch_rows", [7, 1000])
def test_validated_shard_matches_a_serial_hashlib_reference(tmp_path, batch_rows):
    shard = _shard(tmp_path, bad_row=24)
    cfg = CorpusConfig(path=str(shard), on_error="skip")
    out, ref = tmp_path / "validated.parquet", tmp_path / "reference.parquet"
    info = validate_unit(str(shard), cfg, 0.3, 0, out, batch_rows)
    report = _serial_reference(shard, cfg, 0.3, ref, batch_rows)
    assert out.read_bytes() == ref.read_bytes()
    assert pq.ParquetFile(out).metadata.num_row_groups == -(-59 // batch_rows)
    assert 0 < pl.read_parquet(out)["heldout"].sum() < 59
    assert info == json.loads(out.with_suffix(".json").read_text()) == {
        "unit": str(shard), "n_read": report.n_read, "skipped": [list(s) for s in report.skipped]}
    assert info["n_read"] == 60 and info["skipped"] == [[24, "document text is empty, null or whitespace"]]


def test_bad_row_in_a_later_batch_fails_validation_naming_it(tmp_path):
    shard = _shard(tmp_path, bad_row=24)
    out = tmp_path / "validated.parquet"
    with pytest.raises(StrataInputError, match=r"s\.parquet, line 24: document text is empty or whitespace\. Fix: remove the row"):
        validate_unit(str(shard), CorpusConfig(path=str(shard)), 0.3, 0, out, batch_rows=7)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.parquet"]



def test_a_batch_of_skipped_rows_only_is_left_out(tmp_path):
    """With on_error: skip, a Parquet batch whose every row is bad yields no batch (it used to yield
    an empty one, whose row group of 0 rows failed the write)."""
    texts = [f"document {i}" for i in range(6)] + ["", "  ", "\n"] + [f"more {i}" for i in range(3)]
    shard = tmp_path / "s.parquet"
    pl.DataFrame({"id": [f"d{i}" for i in range(len(texts))], "text": texts}).write_parquet(shard)
    out = tmp_path / "validated.parquet"
    info = validate_unit(str(shard), CorpusConfig(path=str(shard), on_error="skip"), 0.0, 0, out, batch_rows=3)
    assert pl.read_parquet(out)["id"].to_list() == [f"d{i}" for i in range(6)] + ["d9", "d10", "d11"]
    assert pq.ParquetFile(out).metadata.num_row_groups == 3
    assert info["n_read"] == 12 and [line for line, _ in info["skipped"]] == [7, 8, 9]


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_repeated_values_are_the_values_counted_more_than_once(monkeypatch, parts):
    """The duplicate-id scan's repeated hashes: np.unique's values with counts > 1, ascending, for
    any number of parts of the value range (values at the range's ends and on its cuts included)."""
    from pipeline.data import corpus as C

    monkeypatch.setattr(C, "cores", lambda: parts)
    rng = np.random.default_rng(9)
    cut = np.uint64((1 << 64) // 2)
    values = np.concatenate([rng.integers(0, 1 << 64, 5000, dtype=np.uint64, endpoint=False),
                             np.array([0, 0, 2**64 - 1, 2**64 - 1, cut, cut, cut - np.uint64(1), 7], np.uint64)])
    values = np.concatenate([values, values[rng.integers(0, values.size, 40)]])[rng.permutation(values.size + 40)]
    uniq, counts = np.unique(values, return_counts=True)
    got = C.repeated_values(values)
    assert got.dtype == np.uint64 and got.tolist() == uniq[counts > 1].tolist()
    assert C.repeated_values(np.arange(10, dtype=np.uint64)).size == 0
