"""The data stage: every corpus shard read and validated, with a seeded held-out split (``corpus``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pipeline.stage import Connect, EngineParams, Markdown, StageParams, StageResult, setting


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


@dataclass(frozen=True)
class TokenizerParams(StageParams):
    """The tokenizer (``tokenizer``): a fixed one, or a byte-level BPE trained on a seeded sample."""

    tokenizer: str = setting()  # "" = train a BPE
    vocab_size: int = setting()
    seed: int = setting(versioned=False)  # the sample (the corpus' parameters)
    tokenizer_sample_chars: int = setting(versioned=False)


@dataclass(frozen=True)
class TokenShardParams(EngineParams):
    """Tokenizing the corpus shards (``token_shards``, ``tokens``): where the work runs, nothing else."""


def build_stage(layout, params: CorpusParams, connect: Connect, log: Callable[[str], None] = print,
                warn: Callable[[str], None] = print) -> StageResult:
    """Read and validate every corpus shard (the validated shards of ``corpus_shards`` reused by
    content fingerprint, any missing one validated here; Ray tasks with ``engine: ray``) and split
    off a seeded held-out set: ``corpus.parquet`` (the training documents; texts stay in the
    validated shards), ``corpus/shards.parquet`` (one row per shard), ``heldout/<source>/val/*.jsonl.gz``
    (Paloma layout, written as the documents are read) and DuckDB ``corpus_stats``. Its ``deps``
    name every gathered shard's ``corpus_shards`` partition; skipped bad records are ``warn``-ed."""
    from evals.paloma import PalomaWriter
    from pipeline.data.corpus import build_corpus, shard_key
    from pipeline.reports.markdown import frame_table
    from pipeline.storage.atomic import atomic_dir, write_parquet
    from pipeline.storage.warehouse import replace_rows

    with atomic_dir(layout.heldout) as tmp, PalomaWriter(tmp) as held:  # the held-out documents written as they are read
        built = build_corpus(params.corpus, params.seed, params.heldout_fraction, layout.shard_dir("corpus"), layout.corpus, log=log,
                             engine=params.engine, ray_cfg=params.ray, heldout=held.add)
    write_parquet(built.manifest, layout.shards)
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
