"""tokenizer, token_shards and tokens: a byte-level BPE trained on a sample of the corpus (or a given one) and token ids."""


import dagster as dg
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.common import SHARD_PARTITIONS, Recorder, StrataSettings
from assets.corpus import gathered_shards, partition_docs
from assets.params import PARAM_CLASSES, asset_config
from pipeline.data.shard_docs import chosen_texts, prune
from pipeline.data.token_shards import gather_tokens, token_files, tokenize_shards, tokenizer_key
from pipeline.data.tokenizer import load_tokenizer, sample_chooser, train_bpe
from pipeline.data.tokens import token_dtype
from pipeline.storage.atomic import atomic_dir

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
            texts = chosen_texts(layout.corpus, pl.read_parquet(layout.shards), layout.shard_dir("corpus"),
                                 sample_chooser(total, cfg.tokenizer_sample_chars, cfg.seed))
            tok = train_bpe(texts, cfg.vocab_size)
        tok.save_pretrained(str(tmp))
    files = sorted(p for p in layout.tokenizer.iterdir() if p.is_file())
    return rec.finish(files, {"vocab_size": len(tok)}, {"tokenizer": cfg.tokenizer or "bpe", "vocab_size": cfg.vocab_size,
                                                        "sample_chars": cfg.tokenizer_sample_chars, "seed": cfg.seed},
                      {"corpus_chars": total})


@dg.asset(group_name="data", deps=["corpus_shards", "tokenizer"], partitions_def=SHARD_PARTITIONS, code_version="1", kinds={"numpy"})
def token_shards(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Token ids of one corpus shard's training documents: ``tokens/shards/<validated>-<tokenizer>.bin``
    (flat ids, EOS after each document) + ``.parquet`` (per-document token, character and byte
    counts), in units of ``shard_docs`` documents on the configured ``engine`` (local or Ray). It
    reads only its shard's validated file, so an appended or edited shard is the only partition to
    run; with a trained tokenizer, a new tokenizer re-runs every partition."""
    rec = Recorder(context, duckdb, {"corpus_shards": context.partition_key, "tokenizer": None})
    cfg, layout = asset_config(context, settings), settings.layout()
    shard = partition_docs(context.partition_key, cfg, layout)
    tok = load_tokenizer(layout.tokenizer)
    run = tokenize_shards([shard], tok, layout.shard_dir("tokens"), layout.inside("work", "tokens"), cfg)
    out_bin, out_stats = token_files(layout.shard_dir("tokens"), shard, tokenizer_key(tok))
    n_tokens = int(pl.read_parquet(out_stats, columns=["n_tokens"])["n_tokens"].sum()) if shard.n_docs else 0
    return rec.finish(
        [out_bin, out_stats] if shard.n_docs else [],
        {"documents": shard.n_docs, "tokens": n_tokens},
        {"shard": shard.unit, "engine": cfg.engine, "shard_docs": cfg.shard_docs},
        {"validated": shard.name, "reused": run["shards_reused"] > 0 or shard.n_docs == 0, "units": run["units"]},
    )


@dg.asset(group_name="data", deps=["corpus", "tokenizer", "token_shards"], code_version="5", kinds={"numpy"})
def tokens(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Token ids of every document (``runs.parquet``: an index over the ``token_shards`` files, in
    corpus order, + ``doc_offsets.npy``) and ``documents.parquet``.

    Indexes the ``token_shards`` files in corpus order, the ids never copied (only the kept
    documents where ``corpus`` dropped some: duplicate ids, ``max_docs``); a shard whose files are
    missing (its partition was not run) is tokenized here, the same way. Memory: one shard's counts."""
    rec = Recorder(context, duckdb, {"corpus": None, "tokenizer": None})
    cfg, layout = asset_config(context, settings), settings.layout()
    tok = load_tokenizer(layout.tokenizer)
    key, shard_dir = tokenizer_key(tok), layout.shard_dir("tokens")
    shards = gathered_shards(layout, rec, "token_shards")
    run = tokenize_shards([s for _, s in shards], tok, shard_dir, layout.inside("work", "tokens"), cfg)
    prune(shard_dir, {f.name for _, s in shards for f in token_files(shard_dir, s, key)})
    dtype = token_dtype(len(tok))
    n_tokens = gather_tokens(shards, key, dtype, shard_dir, layout.corpus, layout.tokens, layout.doc_offsets, layout.documents)
    return rec.finish(
        [layout.documents, layout.tokens, layout.doc_offsets],
        {"documents": int(n_tokens.size), "tokens": int(n_tokens.sum() + n_tokens.size)},
        {"dtype": str(dtype), "engine": cfg.engine, "shard_docs": cfg.shard_docs},
        {"tokens_per_doc_mean": float(n_tokens.mean()), "dtype": str(dtype), **run},
    )
