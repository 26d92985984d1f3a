"""Per-shard work units: the unit functions give the whole-corpus values, reruns reuse shards,
and a run interrupted midway resumes from the units already written."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest

from helpers import demo_slice
from pipeline.config import RayConfig
from pipeline.data.tokenizer import load_tokenizer, train_bpe
from pipeline.data.tokens import tokenize_documents
from pipeline.distributed.text_shards import load_unit, map_corpus_shards, read_docs, tokenize_unit
from pipeline.represent.embeddings import default_model_path, embed, same_tokenizer, shallow_from_ids
from pipeline.storage.fingerprints import tokenizer_fingerprint


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [r["text"][:2000] for r in demo_slice(60)]


@pytest.fixture(scope="module")
def tokenizer(texts):
    return train_bpe(texts, 300)


def test_tokenize_unit_equals_whole_and_per_document(texts, tokenizer):
    flat, n_tokens, n_chars, n_bytes = tokenize_unit(tokenizer.backend_tokenizer.to_str(), tokenizer.eos_token_id, "<u2", texts)
    whole, off = tokenize_documents(tokenizer, texts, progress=False)
    np.testing.assert_array_equal(flat, whole)
    np.testing.assert_array_equal(n_tokens + 1, np.diff(off))
    assert n_chars.tolist() == [len(t) for t in texts] and n_bytes.tolist() == [len(t.encode()) for t in texts]
    eos = tokenizer.eos_token_id
    for i in (0, 17, 59):
        ids = tokenizer.backend_tokenizer.encode(texts[i], add_special_tokens=False).ids + [eos]
        np.testing.assert_array_equal(whole[off[i] : off[i + 1]], ids)


def test_shallow_from_token_ids_equals_tokenizing(texts):
    model = default_model_path()
    tok = load_tokenizer(model)
    assert same_tokenizer(model, tok.backend_tokenizer.to_str())
    assert not same_tokenizer(model, train_bpe(texts, 300).backend_tokenizer.to_str())
    flat, off = tokenize_documents(tok, texts, progress=False)
    n_tokens = np.diff(off) - 1
    ids = np.concatenate([flat[a : b - 1] for a, b in zip(off[:-1], off[1:])])  # EOS dropped
    np.testing.assert_array_equal(shallow_from_ids(model, 32, ids, n_tokens), embed(texts, "shallow", model, 32, progress=False))


def test_fingerprints_change_with_what_produced_them(texts, tokenizer):
    assert tokenizer_fingerprint(train_bpe(texts[:20], 300)) != tokenizer_fingerprint(tokenizer)
    assert tokenizer_fingerprint(train_bpe(texts, 300)) == tokenizer_fingerprint(tokenizer)


def _corpus(tmp_path, texts) -> tuple:
    path = tmp_path / "corpus.parquet"
    pl.DataFrame({"doc_id": range(len(texts)), "text": texts}).write_parquet(path, row_group_size=16)
    manifest = [{"path": f"s{i}", "doc_start": a, "n_docs": b - a, "docs_digest": f"{i:032x}"}
                for i, (a, b) in enumerate([(0, 25), (25, 25), (25, 60)])]  # shard 1 is empty
    return path, manifest


def test_map_corpus_shards_reuses_shards_and_resumes_units(tmp_path, texts, tokenizer):
    path, manifest = _corpus(tmp_path, texts)
    np.testing.assert_array_equal(read_docs(path, 10, 41)["text"].to_list(), texts[10:41])
    cfg = SimpleNamespace(shard_docs=7, engine="local", ray=RayConfig())
    args = (tokenizer.backend_tokenizer.to_str(), tokenizer.eos_token_id, "<u2")
    out, calls = tmp_path / "out", []

    def unit_args(a, b):
        calls.append((a, b))
        return (*args, read_docs(path, a, b)["text"].to_list())

    def assemble(shard, files):
        np.save(out / f"{shard['docs_digest']}.npy", np.concatenate([load_unit(f)[0] for f in files]))

    def run():
        return map_corpus_shards(manifest, tokenize_unit, unit_args, assemble, lambda s: (out / f"{s['docs_digest']}.npy").is_file(),
                                 stage="tokens", key="k", work_dir=tmp_path / "work", cfg=cfg)

    out.mkdir()
    assert run() == {"shards": 3, "shards_computed": 2, "shards_reused": 1, "units": 9, "units_resumed": 0}
    assert calls == [(0, 7), (7, 14), (14, 21), (21, 25), (25, 32), (32, 39), (39, 46), (46, 53), (53, 60)]
    whole, _ = tokenize_documents(tokenizer, texts, progress=False)
    got = np.concatenate([np.load(out / f"{s['docs_digest']}.npy") for s in (manifest[0], manifest[2])])
    np.testing.assert_array_equal(got, whole)
    assert not list((tmp_path / "work").iterdir())  # unit files are removed once their shard is assembled

    calls.clear()
    assert run()["shards_computed"] == 0 and calls == []  # everything reused
    (out / f"{manifest[2]['docs_digest']}.npy").unlink()  # as if a run died after 2 units of shard 2
    for a, b in ((25, 32), (32, 39)):
        np.savez(tmp_path / "work" / f"tokens-{manifest[2]['docs_digest']}-k-{a - 25}.npz", *tokenize_unit(*unit_args(a, b)))
    calls.clear()
    assert run() == {"shards": 3, "shards_computed": 1, "shards_reused": 2, "units": 5, "units_resumed": 2}
    assert calls == [(39, 46), (46, 53), (53, 60)]
    np.testing.assert_array_equal(np.load(out / f"{manifest[2]['docs_digest']}.npy"), whole[got.size - np.load(out / f"{manifest[2]['docs_digest']}.npy").size :])
