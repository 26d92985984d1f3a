"""Content-hash caches: appends, edits and deletions recompute only the changed documents."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from sklearn.feature_extraction.text import HashingVectorizer

from helpers import demo_slice
from pipeline.storage.cache import HashCache, cached_embed, cached_tokenize, embedding_fingerprint, tokenizer_fingerprint
from pipeline.data.corpus import content_hashes
from pipeline.data.tokenizer import train_bpe
from pipeline.data.tokens import token_dtype, tokenize_documents


def _hashes(texts: list[str]) -> list[str]:
    return content_hashes(pl.Series(texts)).to_list()


class Counting:
    """Wraps a real function and records how many documents each call received."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, texts):
        self.calls.append(len(texts))
        return self.fn(texts)


def _hashing_embed(texts: list[str]) -> np.ndarray:
    """A real, batch-invariant embedding (hashed word/bigram counts, L2-normalized)."""
    vec = HashingVectorizer(n_features=64, ngram_range=(1, 2), norm="l2", alternate_sign=False)
    return vec.transform(texts).toarray().astype(np.float32)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [r["text"][:2000] for r in demo_slice(60)]


@pytest.fixture(scope="module")
def tokenizer(texts):
    return train_bpe(texts, 300)


def _edits(texts: list[str]) -> list[str]:
    """Append 3 documents, edit 2, delete 4."""
    new = list(texts)
    new[5] = new[5] + " (edited)"
    new[17] = "A rewritten document. " + new[17][:300]
    del new[30:34]
    return new + ["brand new document one", "brand new document two " * 20, texts[2][::-1]]


def test_embed_append_edit_delete_recomputes_only_changed(tmp_path, texts):
    cache = HashCache(tmp_path, "emb", "hashing-64", np.float32, 64)
    fn = Counting(_hashing_embed)
    first, n = cached_embed(fn, texts, _hashes(texts), cache)
    assert n == len(texts) and fn.calls == [len(texts)]
    np.testing.assert_array_equal(first, _hashing_embed(texts))

    changed = _edits(texts)
    cache = HashCache(tmp_path, "emb", "hashing-64", np.float32, 64)  # reopened from disk
    second, n = cached_embed(fn, changed, _hashes(changed), cache)
    assert n == 5 and fn.calls == [len(texts), 5]  # 2 edits + 3 appends; deletions cost nothing
    np.testing.assert_array_equal(second, _hashing_embed(changed))

    third, n = cached_embed(fn, changed, _hashes(changed), cache)
    assert n == 0 and len(fn.calls) == 2
    np.testing.assert_array_equal(third, second)

    assert cache.prune(_hashes(changed)) == 2 + 4  # edited-away originals + deleted documents
    assert len(HashCache(tmp_path, "emb", "hashing-64", np.float32, 64)) == len(set(_hashes(changed)))


def test_tokens_append_edit_delete_identical_to_full(tmp_path, texts, tokenizer, monkeypatch):
    import pipeline.data.tokens as tokens_mod

    dtype, fp = token_dtype(len(tokenizer)), tokenizer_fingerprint(tokenizer)
    real = tokenize_documents
    counting = Counting(lambda batch: batch)
    monkeypatch.setattr(tokens_mod, "tokenize_documents", lambda tok, batch, **kw: real(tok, counting(batch), **kw))

    cache = HashCache(tmp_path, "tok", fp, dtype)
    flat, off, n = cached_tokenize(tokenizer, texts, _hashes(texts), cache)
    full_flat, full_off = real(tokenizer, texts, progress=False)
    assert n == len(texts) and counting.calls == [len(texts)]
    np.testing.assert_array_equal(flat, full_flat)
    np.testing.assert_array_equal(off, full_off)
    assert flat.dtype == full_flat.dtype

    changed = _edits(texts)
    flat, off, n = cached_tokenize(tokenizer, changed, _hashes(changed), HashCache(tmp_path, "tok", fp, dtype))
    full_flat, full_off = real(tokenizer, changed, progress=False)
    assert n == 5 and counting.calls == [len(texts), 5]
    np.testing.assert_array_equal(flat, full_flat)
    np.testing.assert_array_equal(off, full_off)
    n_tokens = np.diff(off) - 1  # token counts come with the cached ids
    assert n_tokens.sum() == full_flat.size - len(changed)


def test_changed_model_fingerprint_invalidates(tmp_path, texts):
    a = HashCache(tmp_path, "emb", embedding_fingerprint("model-a", 256), np.float32, 64)
    cached_embed(_hashing_embed, texts[:10], _hashes(texts[:10]), a)
    same = HashCache(tmp_path, "emb", embedding_fingerprint("model-a", 256), np.float32, 64)
    assert same.lookup(_hashes(texts[:10]))[0].all()
    other = HashCache(tmp_path, "emb", embedding_fingerprint("model-a", 128), np.float32, 64)
    assert not other.lookup(_hashes(texts[:10]))[0].any()
    fn = Counting(_hashing_embed)
    cached_embed(fn, texts[:10], _hashes(texts[:10]), other)
    assert fn.calls == [10]
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.path.name]  # the stale cache was removed


def test_retrained_tokenizer_invalidates(tmp_path, texts, tokenizer):
    other = train_bpe(texts[:20], 300)
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(tokenizer)
    assert tokenizer_fingerprint(train_bpe(texts, 300)) == tokenizer_fingerprint(tokenizer)


def test_corrupt_or_partial_cache_is_a_miss_not_an_error(tmp_path, texts):
    cache = HashCache(tmp_path, "emb", "fp", np.float32, 64)
    cached_embed(_hashing_embed, texts[:8], _hashes(texts[:8]), cache)
    (cache.path / "values.npy").write_bytes(b"\x93NUMPY truncated")
    reopened = HashCache(tmp_path, "emb", "fp", np.float32, 64)
    assert len(reopened) == 0
    values, n = cached_embed(_hashing_embed, texts[:8], _hashes(texts[:8]), reopened)
    assert n == 8
    np.testing.assert_array_equal(values, _hashing_embed(texts[:8]))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_duplicate_texts_embedded_once(tmp_path, texts):
    batch = [texts[0], texts[1], texts[0], texts[1], texts[2]]
    fn = Counting(_hashing_embed)
    values, n = cached_embed(fn, batch, _hashes(batch), HashCache(tmp_path, "emb", "fp", np.float32, 64))
    assert fn.calls == [3] and n == 3
    np.testing.assert_array_equal(values, _hashing_embed(batch))


def test_width_learned_when_dim_is_zero(tmp_path, texts):
    values, _ = cached_embed(_hashing_embed, texts[:5], _hashes(texts[:5]), HashCache(tmp_path, "emb", "fp", np.float32, 0))
    reopened = HashCache(tmp_path, "emb", "fp", np.float32, 0)
    assert reopened.dim == 64 and reopened.lookup(_hashes(texts[:5]))[0].all()
    np.testing.assert_array_equal(reopened.lookup(_hashes(texts[:5]))[1], values)


def test_bad_hash_is_rejected(tmp_path):
    cache = HashCache(tmp_path, "emb", "fp", np.float32, 4)
    with pytest.raises(ValueError, match="not a hex SHA-256"):
        cache.lookup(["abc"])


def test_real_model_cache_matches_full_run_within_float_rounding(tmp_path, texts):
    """With all-MiniLM-L6-v2, a document's embedding depends on its batch-mates in the last bits
    (different padding => different GEMM shapes), so cached + fresh equals a full run only to ~1e-7."""
    from pipeline.represent.embeddings import default_model_path, embed_texts

    small = [t[:400] for t in texts[:12]]
    path = default_model_path()
    cache = HashCache(tmp_path, "emb", embedding_fingerprint(path, 32), np.float32, 384)

    def fn(batch):
        return embed_texts(batch, path, max_tokens=32, batch_size=8, progress=False)

    counting = Counting(fn)
    cached_embed(counting, small[:9], _hashes(small[:9]), cache)
    values, n = cached_embed(counting, small, _hashes(small), cache)
    assert n == 3 and counting.calls == [9, 3]
    np.testing.assert_allclose(values, fn(small), atol=1e-6, rtol=0)
