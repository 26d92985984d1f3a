"""The data stage: every corpus shard read and validated, with a seeded held-out split (``corpus``)."""

from __future__ import annotations

from typing import Callable

from pipeline.stage import Connect, Markdown, StageResult


def build_stage(layout, cfg, connect: Connect, log: Callable[[str], None] = print,
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
        built = build_corpus(cfg.corpus, cfg.seed, cfg.heldout_fraction, layout.shard_dir("corpus"), layout.corpus, log=log,
                             engine=cfg.engine, ray_cfg=cfg.ray, heldout=held.add)
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
        [layout.corpus, layout.shards, *held_files],
        {"train_docs": n_train, "heldout_docs": built.n_heldout, "skipped": len(report.skipped), "shards": built.manifest.height},
        {"corpus": cfg.corpus.path or cfg.corpus.hf_dataset or "builtin", "heldout_fraction": cfg.heldout_fraction, "seed": cfg.seed,
         "engine": cfg.engine},
        {"sources": Markdown(frame_table(built.stats)), "shards_validated": built.validated, "shards_reused": built.reused,
         "skipped_by_shard": report.skipped_by_shard},
        deps={"corpus_shards": [shard_key(u) for u in built.manifest["path"]]},
    )
