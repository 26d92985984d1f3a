"""Bad input stops with a message naming the file, the line and the fix."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from pipeline.config import CorpusConfig, config_from_dict
from helpers import built_corpus
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
