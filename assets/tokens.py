"""tokenizer and tokens: a byte-level BPE trained on the corpus (or a given one) and token ids."""


import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.params import PARAM_CLASSES, asset_config
from assets.common import Recorder, StrataSettings
from pipeline.distributed.text_shards import clear_shards, map_text_shards, tokenize_shard
from pipeline.storage.cache import HashCache, cached_tokenize, tokenizer_fingerprint
from pipeline.storage.atomic import atomic_dir, write_bin, write_npy, write_parquet
from pipeline.data.tokenizer import load_tokenizer, sample_texts, train_bpe
from pipeline.data.tokens import token_dtype


TokenizerParams = PARAM_CLASSES["tokenizer"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="data", deps=["corpus"], code_version="2", kinds={"huggingface"})
def tokenizer(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
              config: TokenizerParams) -> dg.MaterializeResult:
    """Train a byte-level BPE (``vocab_size`` ids) on a seeded sample of about ``tokenizer_sample_chars``
    characters of the training documents (streamed; all of them when the corpus is smaller), or copy a given tokenizer."""
    rec = Recorder(context, duckdb, {"corpus": None})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    total = int(pl.read_parquet(layout.shards, columns=["n_chars"])["n_chars"].sum())
    with atomic_dir(layout.tokenizer) as tmp:
        if cfg.tokenizer:
            tok = load_tokenizer(cfg.tokenizer)
        else:
            tok = train_bpe(sample_texts(layout.corpus, total, cfg.tokenizer_sample_chars, cfg.seed), cfg.vocab_size)
        tok.save_pretrained(str(tmp))
    files = sorted(p for p in layout.tokenizer.iterdir() if p.is_file())
    return rec.finish(files, {"vocab_size": len(tok)}, {"tokenizer": cfg.tokenizer or "bpe", "vocab_size": cfg.vocab_size,
                                                        "sample_chars": cfg.tokenizer_sample_chars, "seed": cfg.seed},
                      {"corpus_chars": total})


@dg.asset(group_name="data", deps=["corpus", "tokenizer"], code_version="2", kinds={"numpy"})
def tokens(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Token ids of every document (flat ``tokens.bin`` + ``doc_offsets.npy``) and ``documents.parquet``.

    Token ids are cached per content hash (``cache/tokens``): with a fixed tokenizer, only new or
    edited documents are tokenized on a rerun. The misses are tokenized in shards of
    ``shard_docs`` documents on the configured ``engine`` (local or Ray)."""
    rec = Recorder(context, duckdb, {"corpus": None, "tokenizer": None})
    cfg, layout = asset_config(context, settings), settings.layout()
    tok = load_tokenizer(layout.tokenizer)
    corpus = pl.read_parquet(layout.corpus)
    hashes = corpus["content_hash"].to_list()
    fingerprint = tokenizer_fingerprint(tok)
    cache = HashCache(layout.inside("cache"), "tokens", fingerprint, token_dtype(len(tok)))
    work = layout.inside("work", "tokens")
    shard_stats: dict[str, int] = {}

    def tokenize_fn(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        args = (tok.backend_tokenizer.to_str(), tok.eos_token_id, token_dtype(len(tok)).str)
        parts = map_text_shards(tokenize_shard, args, texts, stage="tokens", fingerprint=fingerprint, stats=shard_stats, work_dir=work, cfg=cfg)
        flat = np.concatenate([p[0] for p in parts])
        offsets = np.concatenate([[0], np.cumsum(np.concatenate([np.diff(p[1]) for p in parts]))]).astype(np.int64)
        return flat, offsets

    flat, offsets, computed = cached_tokenize(tok, corpus["text"].to_list(), hashes, cache, tokenize_fn)
    cache.prune(hashes)
    clear_shards(work, "tokens")
    write_bin(flat, layout.tokens)
    write_npy(offsets, layout.doc_offsets)
    n_tokens = np.diff(offsets) - 1
    docs = corpus.select("doc_id", "id", "source", "subdomain", "content_hash").with_columns(
        n_chars=corpus["text"].str.len_chars().cast(pl.Int64),
        n_bytes=corpus["text"].str.len_bytes().cast(pl.Int64),
        n_tokens=pl.Series(n_tokens, dtype=pl.Int64),
    )
    write_parquet(docs, layout.documents)
    return rec.finish(
        [layout.documents, layout.tokens, layout.doc_offsets],
        {"documents": docs.height, "tokens": int(flat.size)},
        {"dtype": str(flat.dtype), "engine": cfg.engine, "shard_docs": cfg.shard_docs},
        {"tokens_per_doc_mean": float(n_tokens.mean()), "dtype": str(flat.dtype),
         "tokenized": computed, "from_cache": corpus.height - computed, **shard_stats},
    )
