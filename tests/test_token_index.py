"""The token store read through its index over the token_shards files holds the ids of tokenizing the corpus in order."""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl
import pytest
from helpers import three_shard_corpus

from pipeline.config import config_from_dict
from pipeline.data.shard_docs import chosen_texts, corpus_texts, manifest_shards
from pipeline.data.token_index import ShardedTokens
from pipeline.data.token_shards import gather_tokens, tokenize_shards, tokenizer_key
from pipeline.data.tokenizer import train_bpe
from pipeline.data.tokens import open_tokens, token_dtype, tokenize_documents
from pipeline.errors import StrataInputError
from pipeline.packing.pack import SequenceStore, pack


def _store(tmp_path, max_docs: int):
    build, out, by_id = three_shard_corpus(tmp_path, max_docs)
    shards = manifest_shards(build.manifest, out / "corpus" / "shards")
    tok = train_bpe(list(by_id.values()), 600)
    cfg = config_from_dict({"data_root": str(out), "shard_docs": 16})
    tokenize_shards([s for _, s in shards], tok, out / "tokens" / "shards", out / "work", cfg)
    key, dtype = tokenizer_key(tok), token_dtype(len(tok))
    gather_tokens(shards, key, dtype, out / "tokens" / "shards", out / "corpus.parquet", out / "tokens" / "runs.parquet",
                  out / "tokens" / "doc_offsets.npy", out / "documents.parquet")
    reader, offsets = open_tokens(out / "tokens" / "runs.parquet", out / "tokens" / "doc_offsets.npy")
    texts = [by_id[i] for i in pl.read_parquet(out / "corpus.parquet")["id"].to_list()]
    # corpus.parquet holds no texts: corpus_texts reads them from the validated shards, in doc_id order
    assert [t for batch in corpus_texts(out / "corpus.parquet", build.manifest, out / "corpus" / "shards", batch_rows=7)
            for t in batch.to_list()] == texts
    flat, want = tokenize_documents(tok, texts, progress=False)
    np.testing.assert_array_equal(offsets, want)
    return reader, flat, offsets, out


@pytest.mark.parametrize("max_docs", [0, 70])  # every document; a sample (corpus.parquet keeps some rows of each shard)
def test_chosen_texts_reads_the_chosen_documents_in_order(tmp_path, max_docs):
    from pipeline.config import CorpusConfig
    from pipeline.data.corpus import build_corpus

    _, out, by_id = three_shard_corpus(tmp_path, max_docs)
    build = build_corpus(CorpusConfig(path=str(tmp_path / f"src{max_docs}"), max_docs=max_docs), 0, 0.0, out / "small",
                         out / "corpus.parquet", batch_rows=4)  # row groups of 4 documents
    texts = [by_id[i] for i in pl.read_parquet(out / "corpus.parquet")["id"].to_list()]
    sizes = build.manifest["n_docs"].to_list()
    rng = np.random.default_rng(max_docs)
    picks = [np.sort(rng.choice(n, n // 3, replace=False)) for n in sizes]
    starts = np.cumsum([0] + sizes)
    want = [texts[a + int(i)] for a, p in zip(starts, picks) for i in p]
    for read_rows in (1, 8, 65_536):  # a task a row group, two row groups, a shard
        every = iter(range(len(sizes)))
        assert list(chosen_texts(out / "corpus.parquet", build.manifest, out / "small", lambda n: None, read_rows)) == texts
        chosen = list(chosen_texts(out / "corpus.parquet", build.manifest, out / "small",
                                   lambda n, every=every: picks[next(every)] if n else None, read_rows))
        assert chosen == want and 0 < len(chosen) < len(texts)
    none = list(chosen_texts(out / "corpus.parquet", build.manifest, out / "small", lambda n: np.zeros(0, np.int64)))
    assert none == []


def test_index_reads_the_ids_of_the_corpus_in_order_and_gives_the_same_sequences(tmp_path):
    for max_docs in (0, 70):  # every document of every shard (one run a shard); a sample (runs of kept rows)
        reader, tokens, offsets, out = _store(tmp_path, max_docs)
        assert isinstance(reader, ShardedTokens) and reader.dtype == tokens.dtype
        runs = reader.runs
        assert len(reader) == tokens.size == int(offsets[-1])
        assert (len(runs.file) == len(runs.paths) == 3) == (max_docs == 0)
        np.testing.assert_array_equal(np.asarray(reader), tokens)
        rng = np.random.default_rng(max_docs)
        pos = rng.integers(0, tokens.size, (50, 7))
        np.testing.assert_array_equal(reader[pos], tokens[pos])
        np.testing.assert_array_equal(reader[5:tokens.size - 3:4], tokens[5:tokens.size - 3:4])
        for d in rng.integers(0, offsets.size - 1, 20):  # a document, and spans across runs and shards
            np.testing.assert_array_equal(reader[offsets[d] : offsets[d + 1]], tokens[offsets[d] : offsets[d + 1]])
        for a, b in [(0, tokens.size), (int(runs.start[1]) - 2, int(runs.start[-2]) + 3), (7, 7), (tokens.size - 1, tokens.size + 5)]:
            np.testing.assert_array_equal(reader[a:b], tokens[a:b])
        assert reader[-1] == tokens[-1] and reader[17] == tokens[17]

        lengths = np.diff(offsets)
        segments = pack("best_fit", rng.permutation(lengths.size), lengths, 64, seed=0).segments
        flat_store, index_store = SequenceStore(tokens, offsets, segments, 64), SequenceStore(reader, offsets, segments, 64)
        ids = rng.permutation(flat_store.n_sequences)
        want = flat_store.batch(ids)[0]  # token by token from the flat array
        for got in (index_store.rows(ids, block=5), flat_store.rows(ids, block=5), index_store.batch(ids)[0]):
            assert got.dtype == tokens.dtype or got.dtype == np.int64
            np.testing.assert_array_equal(got, want)

    index = pl.read_parquet(out / "tokens" / "runs.parquet")
    assert {(p, d) for p, d in index.select("path", "sha256").unique().iter_rows()} == {
        (str(f.relative_to(out / "tokens")), hashlib.sha256(f.read_bytes()).hexdigest()) for f in runs.paths}
    runs.paths[0].unlink()
    with pytest.raises(StrataInputError, match="token shard file .* is missing"):
        open_tokens(out / "tokens" / "runs.parquet", out / "tokens" / "doc_offsets.npy")
