"""tokenizer and tokens: a byte-level BPE trained on a sample of the corpus (or a given one) and token ids."""


import dagster as dg
import numpy as np
import polars as pl
import pyarrow.parquet as pq
from dagster_duckdb import DuckDBResource

from assets.params import PARAM_CLASSES, asset_config
from assets.common import Recorder, StrataSettings
from pipeline.distributed.text_shards import load_unit, map_corpus_shards, prune, read_docs, tokenize_unit
from pipeline.storage.fingerprints import fingerprint_digest, tokenizer_fingerprint
from pipeline.storage.atomic import atomic_dir, atomic_path, write_npy, write_parquet
from pipeline.data.tokenizer import load_tokenizer, sample_texts, train_bpe
from pipeline.data.tokens import concat_files, token_dtype


TokenizerParams = PARAM_CLASSES["tokenizer"]  # launchpad: this asset's parameters (assets/params.py)
TOKEN_STATS = {"n_tokens": pl.Int64, "n_chars": pl.Int64, "n_bytes": pl.Int64}


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


@dg.asset(group_name="data", deps=["corpus", "tokenizer"], code_version="3", kinds={"numpy"})
def tokens(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Token ids of every document (flat ``tokens.bin`` + ``doc_offsets.npy``) and ``documents.parquet``.

    Each corpus shard is tokenized on its own into ``tokens/shards/<docs>-<tokenizer>.bin`` (+ a
    Parquet of per-document token, character and byte counts), in units of ``shard_docs``
    documents on the configured ``engine`` (local or Ray): with a fixed tokenizer, a rerun
    tokenizes only new or edited shards. The store is the shards' files concatenated in corpus
    order; memory stays bounded by the units in flight."""
    rec = Recorder(context, duckdb, {"corpus": None, "tokenizer": None})
    cfg, layout = asset_config(context, settings), settings.layout()
    tok = load_tokenizer(layout.tokenizer)
    dtype = token_dtype(len(tok))
    key = fingerprint_digest(tokenizer_fingerprint(tok))
    manifest = pl.read_parquet(layout.shards).to_dicts()
    shard_dir = layout.shard_dir("tokens")
    shard_dir.mkdir(parents=True, exist_ok=True)
    args = (tok.backend_tokenizer.to_str(), tok.eos_token_id, dtype.str)

    def files(shard: dict):
        name = f"{shard['docs_digest']}-{key}"
        return shard_dir / f"{name}.bin", shard_dir / f"{name}.parquet"

    def assemble(shard: dict, unit_files) -> None:
        out_bin, out_stats = files(shard)
        stats = []
        with atomic_path(out_bin) as tmp, open(tmp, "wb") as fh:
            for f in unit_files:
                flat, n_tokens, n_chars, n_bytes = load_unit(f)
                fh.write(flat.tobytes())
                stats.append(pl.DataFrame({"n_tokens": n_tokens, "n_chars": n_chars, "n_bytes": n_bytes}, schema=TOKEN_STATS))
        write_parquet(pl.concat(stats), out_stats)

    run = map_corpus_shards(
        manifest, tokenize_unit, lambda a, b: (*args, read_docs(layout.corpus, a, b)["text"].to_list()), assemble,
        lambda s: all(f.is_file() for f in files(s)), stage="tokens", key=key, work_dir=layout.inside("work", "tokens"), cfg=cfg,
    )
    live = [s for s in manifest if int(s["n_docs"])]
    prune(shard_dir, {f.name for s in live for f in files(s)})
    concat_files([files(s)[0] for s in live], layout.tokens)
    n_tokens = np.concatenate([pl.read_parquet(files(s)[1], columns=["n_tokens"])["n_tokens"].to_numpy() for s in live])
    offsets = np.zeros(n_tokens.size + 1, dtype=np.int64)
    np.cumsum(n_tokens + 1, out=offsets[1:])
    write_npy(offsets, layout.doc_offsets)
    if layout.tokens.stat().st_size != int(offsets[-1]) * dtype.itemsize:
        raise RuntimeError(f"{layout.tokens}: size does not match {int(offsets[-1])} tokens; delete {shard_dir} and rerun")
    _write_documents(layout, live, [files(s)[1] for s in live])
    return rec.finish(
        [layout.documents, layout.tokens, layout.doc_offsets],
        {"documents": int(n_tokens.size), "tokens": int(offsets[-1])},
        {"dtype": str(dtype), "engine": cfg.engine, "shard_docs": cfg.shard_docs},
        {"tokens_per_doc_mean": float(n_tokens.mean()), "dtype": str(dtype), **run},
    )


def _write_documents(layout, shards: list[dict], stats: list) -> None:
    """``documents.parquet`` streamed shard by shard: the corpus columns without text + token counts."""
    cols = ["doc_id", "id", "source", "subdomain", "content_hash"]
    with atomic_path(layout.documents) as tmp:
        writer = None
        try:
            for shard, stat in zip(shards, stats):
                lo = int(shard["doc_start"])
                docs = read_docs(layout.corpus, lo, lo + int(shard["n_docs"]), cols)
                table = docs.with_columns(pl.read_parquet(stat).select(["n_chars", "n_bytes", "n_tokens"])).to_arrow()
                if writer is None:
                    writer = pq.ParquetWriter(tmp, table.schema, compression="zstd", write_statistics=False)
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()
