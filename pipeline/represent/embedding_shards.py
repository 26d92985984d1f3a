"""Embeddings per corpus shard (the ``embedding_shards`` partitions).

Each validated shard's training rows are embedded on their own into
``embeddings/shards/<validated>-<model>.npy`` (float32, unit-norm rows; the rows' norm range
beside it, :mod:`pipeline.represent.embedding_norms`), in work units of
``shard_docs`` documents on the configured engine: in this process, or on Ray model actors. With
``shallow`` embeddings and the pipeline's tokenizer equal to the model's, a unit's ids are read
from the shard's token files (:mod:`pipeline.data.token_shards`) instead of tokenizing again.
The ``embeddings`` asset indexes the shards' rows in corpus order (:mod:`pipeline.represent.embedding_index`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Iterator

import numpy as np
import polars as pl

from pipeline.data.shard_docs import ShardDocs, read_shard_docs
from pipeline.data.tokens import token_dtype_of
from pipeline.distributed.units import map_corpus_shards
from pipeline.represent.embedding_norms import NormRange, record_norms
from pipeline.represent.embeddings import IMPLEMENTATION, embed, shallow_from_ids
from pipeline.storage.atomic import write_rows
from pipeline.storage.fingerprints import embedding_fingerprint, fingerprint_digest
from pipeline.storage.integrity import intact


def embed_unit(method: str, model: str, max_tokens: int, batch_size: int, progress: bool, texts: list[str]) -> np.ndarray:
    """Unit-norm embeddings of one unit's texts (:func:`pipeline.represent.embeddings.embed`, no
    checkpoints: a unit is the unit of resumption, so its batches never depend on an interruption)."""
    return embed(texts, method, model, max_tokens, batch_size, work_dir=None, progress=progress)


def embed_unit_from_ids(model: str, max_tokens: int, ids: np.ndarray, n_tokens: np.ndarray) -> np.ndarray:
    """``shallow`` embeddings of one unit from its token-store ids (the pipeline's tokenizer is the
    model's): equal to :func:`embed_unit` on the texts, without tokenizing again."""
    return shallow_from_ids(model, max_tokens, ids, n_tokens)


def embedding_key(model: str, max_tokens: int, method: str) -> str:
    """What names a shard's embeddings: the model's files, ``embed_method``, ``embed_max_tokens``."""
    return fingerprint_digest(embedding_fingerprint(model, max_tokens, method=method, implementation=IMPLEMENTATION))


def embedding_file(shard_dir: Path, shard: ShardDocs, key: str) -> Path:
    return shard_dir / f"{shard.name}-{key}.npy"


def embed_shards(shards: list[ShardDocs], cfg, model: str, shard_dir: Path, work_dir: Path,
                 token_files=None) -> dict[str, int]:
    """Embed every shard whose file is missing (:func:`map_corpus_shards`'s counts plus
    ``from_token_store``). ``token_files(shard)`` gives a shard's token ``(.bin, .parquet)`` when
    ``shallow`` may read the token store (the pipeline's tokenizer is the model's), else None."""
    key = embedding_key(model, cfg.embed_max_tokens, cfg.embed_method)
    shard_dir.mkdir(parents=True, exist_ok=True)
    from_store = cfg.embed_method == "shallow" and token_files is not None and all(
        all(f.is_file() for f in token_files(s)) for s in shards)

    def assemble(shard: ShardDocs, results: Iterator[tuple]) -> None:
        norms, out = NormRange(), embedding_file(shard_dir, shard, key)
        write_rows((norms.add(r[0]) for r in results), shard.n_docs, out)
        record_norms(out, norms)

    if from_store:
        @functools.lru_cache(maxsize=1)  # units come shard by shard: read each shard's counts once
        def shard_store(shard: ShardDocs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            bin_path, stats_path = token_files(shard)
            n_all = pl.read_parquet(stats_path, columns=["n_tokens"])["n_tokens"].to_numpy()
            offsets = np.concatenate([[0], np.cumsum(n_all + 1)])
            return np.memmap(bin_path, dtype=token_dtype_of(bin_path, offsets), mode="r"), offsets, n_all

        def unit_args(shard: ShardDocs, a: int, b: int) -> tuple:
            store, offsets, n_all = shard_store(shard)
            keep = np.minimum(n_all[a:b], cfg.embed_max_tokens) if cfg.embed_max_tokens > 0 else n_all[a:b]
            ids = np.concatenate([store[o : o + k] for o, k in zip(offsets[a:b], keep)])
            return (model, cfg.embed_max_tokens, ids, keep)

        fn = embed_unit_from_ids
    else:
        args = (cfg.embed_method, cfg.embed_model, cfg.embed_max_tokens, cfg.embed_batch_size, False)

        def unit_args(shard: ShardDocs, a: int, b: int) -> tuple:
            return (*args, read_shard_docs(shard, a, b)["text"].to_list())

        fn = embed_unit
    run = map_corpus_shards(shards, fn, unit_args, assemble, lambda s: intact([embedding_file(shard_dir, s, key)]), stage="embeddings",
                            key=key, work_dir=work_dir, cfg=cfg, actors=not from_store,
                            checkpoint=cfg.embed_method != "shallow")
    return {**run, "from_token_store": bool(from_store)}
