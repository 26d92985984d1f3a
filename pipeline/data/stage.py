"""The data stage: each corpus shard read and validated (``corpus_shards``), gathered with a seeded
held-out split (``corpus``); the tokenizer; each shard's token ids (``token_shards``), gathered (``tokens``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import polars as pl

from pipeline.data.blend_names import check_blend_names
from pipeline.data.corpus import build_corpus, corpus_columns, shard_key
from pipeline.data.gather import gather_shards, partition_shard, shard_facts, validated_shard
from pipeline.data.paloma import PalomaWriter
from pipeline.data.shard_docs import chosen_texts
from pipeline.data.token_shards import gather_tokens, token_files, tokenize_shards, tokenizer_key
from pipeline.data.tokenizer import load_tokenizer, sample_chooser, train_bpe
from pipeline.data.tokens import token_dtype
from pipeline.render.markdown import frame_table
from pipeline.stage import Connect, EngineParams, Markdown, StageParams, StageResult, setting
from pipeline.storage.atomic import atomic_dir, is_sidecar, write_parquet
from pipeline.storage.warehouse import replace_rows


@dataclass(frozen=True)
class CorpusShardParams(StageParams):
    """One corpus shard read and validated (``corpus_shards``); the reading options and the shard's
    content are ``raw_shards``' data version, not parameters."""

    corpus: Any = setting(versioned=False)  # pipeline.config.CorpusConfig
    heldout_fraction: float = setting()
    seed: int = setting()  # the held-out split
    engine: str = setting(versioned=False)
    ray: Any = setting(versioned=False)


@dataclass(frozen=True)
class CorpusParams(StageParams):
    """The data stage's settings (``corpus``)."""

    corpus: Any = setting()  # pipeline.config.CorpusConfig
    heldout_fraction: float = setting()
    seed: int = setting()  # the held-out split
    engine: str = setting(versioned=False)
    ray: Any = setting(versioned=False)
    mixture: Any = setting(versioned=False)  # a blend's group names, checked against the corpus (pipeline.data.blend_names)
    strategies: list = setting(versioned=False)


@dataclass(frozen=True)
class TokenizerParams(StageParams):
    """The tokenizer (``tokenizer``): a fixed one, or a byte-level BPE trained on a seeded sample."""

    tokenizer: str = setting()  # "" = train a BPE
    vocab_size: int = setting()
    seed: int = setting(versioned=False)  # the sample (the corpus' parameters)
    tokenizer_sample_chars: int = setting()  # the sample the BPE trains on: another gives another tokenizer


@dataclass(frozen=True)
class TokenShardParams(EngineParams):
    """Tokenizing the corpus shards (``token_shards``, ``tokens``): where the work runs, nothing else
    (``corpus_shard``: which rows a partition's shard holds, ``corpus_shards``' parameters)."""

    corpus_shard: CorpusShardParams = setting(versioned=False, convert=CorpusShardParams)


def validate_corpus_shard(layout, params: CorpusShardParams, partition_key: str) -> StageResult:
    """One corpus shard (a ``corpus_shard`` partition) read and validated into
    ``corpus/shards/<fingerprint>-<split>.parquet`` (+ ``.json``, its report): records with content
    hash and held-out flag, on a Ray worker with ``engine: ray``. An unchanged shard is not read again."""
    unit, fp, out, info, reused = validated_shard(layout, params, partition_key)
    return StageResult(
        outputs=[out, out.with_suffix(".json")],
        rows={"records": info["n_read"], "skipped": len(info["skipped"])},
        parameters={"shard": unit, "heldout_fraction": params.heldout_fraction, "seed": params.seed},
        facts={"fingerprint": fp, "reused": reused},
    )


def build_stage(layout, params: CorpusParams, connect: Connect, log: Callable[[str], None] = print,
                warn: Callable[[str], None] = print) -> StageResult:
    """Read and validate every corpus shard (the validated shards of ``corpus_shards`` reused by
    content fingerprint, any missing one validated here; Ray tasks with ``engine: ray``) and split
    off a seeded held-out set: ``corpus.parquet`` (the training documents; texts stay in the
    validated shards), ``corpus/shards.parquet`` (one row per shard), ``heldout/<source>/val/*.jsonl.gz``
    (Paloma layout, written as the documents are read) and DuckDB ``corpus_stats``. Its ``deps``
    name every gathered shard's ``corpus_shards`` partition; skipped bad records are ``warn``-ed."""
    with atomic_dir(layout.heldout) as tmp, PalomaWriter(tmp) as held:  # the held-out documents written as they are read
        built = build_corpus(params.corpus, params.seed, params.heldout_fraction, layout.shard_dir("corpus"), layout.corpus, log=log,
                             engine=params.engine, ray_cfg=params.ray, heldout=held.add)
    write_parquet(built.manifest, layout.shards)
    check_blend_names(layout.corpus, params.mixture, params.strategies)  # before the tokenizer and the embeddings
    held_files = sorted(layout.heldout.rglob("*.jsonl.gz"))
    with connect() as con:
        replace_rows(con, "corpus_stats", built.stats, {})
    report = built.report
    if report.skipped:
        per_shard = {k: v for k, v in report.skipped_by_shard.items() if v}
        warn(f"skipped {len(report.skipped)} bad records (per shard: {per_shard}); first: {report.skipped[:5]}")
    n_train = int(built.manifest["n_docs"].sum())
    return StageResult(
        outputs=[layout.corpus, layout.shards, *held_files],
        rows={"train_docs": n_train, "heldout_docs": built.n_heldout, "skipped": len(report.skipped), "shards": built.manifest.height},
        parameters={"corpus": params.corpus.path or params.corpus.hf_dataset or "builtin", "heldout_fraction": params.heldout_fraction,
                    "seed": params.seed, "engine": params.engine},
        facts={"sources": Markdown(frame_table(built.stats)), "shards_validated": built.validated, "shards_reused": built.reused,
               "skipped_by_shard": report.skipped_by_shard},
        deps={"corpus_shards": [shard_key(u) for u in built.manifest["path"]]},
    )


def train_tokenizer(layout, params: TokenizerParams) -> StageResult:
    """A byte-level BPE (``vocab_size`` ids) trained on a seeded sample of about
    ``tokenizer_sample_chars`` characters of the training documents (streamed; all of them when the
    corpus is smaller), or the given ``tokenizer`` copied: ``tokenizer/``."""
    total = int(pl.read_parquet(layout.shards, columns=["n_chars"])["n_chars"].sum())
    with atomic_dir(layout.tokenizer) as tmp:
        if params.tokenizer:
            tok = load_tokenizer(params.tokenizer)
        else:
            texts = chosen_texts(layout.corpus, pl.read_parquet(layout.shards), layout.shard_dir("corpus"),
                                 sample_chooser(total, params.tokenizer_sample_chars, params.seed))
            tok = train_bpe(texts, params.vocab_size)
        tok.save_pretrained(str(tmp))
    files = sorted(p for p in layout.tokenizer.iterdir() if p.is_file() and not is_sidecar(p))
    return StageResult(outputs=files, rows={"vocab_size": len(tok)},
                       parameters={"tokenizer": params.tokenizer or "bpe", "vocab_size": params.vocab_size,
                                   "sample_chars": params.tokenizer_sample_chars, "seed": params.seed},
                       facts={"corpus_chars": total})


def tokenize_shard(layout, params: TokenShardParams, partition_key: str) -> StageResult:
    """Token ids of one corpus shard's training documents: ``tokens/shards/<validated>-<tokenizer>.bin``
    (flat ids, EOS after each document) + ``.parquet`` (per-document token, character and byte
    counts), in units of ``shard_docs`` documents on the configured ``engine``."""
    shard = partition_shard(layout, params.corpus_shard, partition_key)
    tok = load_tokenizer(layout.tokenizer)
    run = tokenize_shards([shard], tok, layout.shard_dir("tokens"), layout.inside("work", "tokens"), params)
    out_bin, out_stats = token_files(layout.shard_dir("tokens"), shard, tokenizer_key(tok))
    n_tokens = int(pl.read_parquet(out_stats, columns=["n_tokens"])["n_tokens"].sum()) if shard.n_docs else 0
    return StageResult(outputs=[out_bin, out_stats] if shard.n_docs else [], rows={"documents": shard.n_docs, "tokens": n_tokens},
                       parameters={"shard": shard.unit, "engine": params.engine, "shard_docs": params.shard_docs},
                       facts=shard_facts(shard, run, units=run["units"]))


def gather_token_ids(layout, params: TokenShardParams) -> StageResult:
    """The token store: ``tokens/runs.parquet`` (an index over the ``token_shards`` files in corpus
    order, the ids never copied; only the kept documents where ``corpus`` dropped some),
    ``doc_offsets.npy`` and ``documents.parquet``. A shard whose files are missing is tokenized here,
    the same way (:func:`pipeline.data.gather.gather_shards`)."""
    tok = load_tokenizer(layout.tokenizer)
    key, shard_dir = tokenizer_key(tok), layout.shard_dir("tokens")
    g = gather_shards(layout, "tokens", lambda docs: tokenize_shards(docs, tok, shard_dir, layout.inside("work", "tokens"), params),
                      lambda s: token_files(shard_dir, s, key))
    dtype = token_dtype(len(tok))
    n_tokens = gather_tokens(g.shards, key, dtype, shard_dir, layout.corpus, layout.tokens, layout.doc_offsets, layout.documents,
                             corpus_columns(layout.corpus))
    return StageResult(
        outputs=[layout.documents, layout.tokens, layout.doc_offsets],
        rows={"documents": int(n_tokens.size), "tokens": int(n_tokens.sum() + n_tokens.size)},
        parameters={"dtype": str(dtype), "engine": params.engine, "shard_docs": params.shard_docs},
        facts={"tokens_per_doc_mean": float(n_tokens.mean()), "dtype": str(dtype), **g.run},
        deps=g.deps("token_shards"),
    )
