"""corpus: the validated documents (training split) and the held-out split in Paloma layout."""


import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.params import PARAM_CLASSES, asset_config
from assets.common import Recorder, StrataSettings
from pipeline.data.corpus import build_corpus, corpus_fingerprint
from evals.paloma import write_paloma_layout
from pipeline.storage.atomic import atomic_dir, write_parquet
from pipeline.storage.warehouse import replace_rows


@dg.observable_source_asset(group_name="data", description="The raw corpus (shards, dataset or built-in); its data version is a hash of every shard's content and the reading options.")
def raw_corpus(settings: StrataSettings) -> dg.DataVersion:
    return dg.DataVersion(corpus_fingerprint(settings.config().corpus))


CorpusParams = PARAM_CLASSES["corpus"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="data", deps=["raw_corpus"], code_version="2", kinds={"parquet"})
def corpus(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
           config: CorpusParams) -> dg.MaterializeResult:
    """Read and validate every corpus shard as a stream of batches; split off a seeded held-out set.

    Writes ``corpus.parquet`` (doc_id, id, text, source, subdomain, content_hash, shard) for
    training, ``corpus/shards.parquet`` (one row per shard) and ``heldout/<source>/val/*.jsonl.gz``
    (Paloma layout) for evaluation. Validated shards are kept under ``corpus/shards/`` by content
    fingerprint: an unchanged shard is not read again. With ``engine: ray`` the shards are read
    and validated as Ray tasks (workers need read access to the raw shards).
    """
    rec = Recorder(context, duckdb, {})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    built = build_corpus(cfg.corpus, cfg.seed, cfg.heldout_fraction, layout.shard_dir("corpus"), layout.corpus, log=context.log.info,
                         engine=cfg.engine, ray_cfg=cfg.ray)
    write_parquet(built.manifest, layout.shards)
    with atomic_dir(layout.heldout) as tmp:
        if built.heldout.height:
            write_paloma_layout(built.heldout, tmp)
    held_files = sorted(layout.heldout.rglob("*.jsonl.gz"))
    with duckdb.get_connection() as con:
        replace_rows(con, "corpus_stats", built.stats, {})
    report = built.report
    if report.skipped:
        per_shard = {k: v for k, v in report.skipped_by_shard.items() if v}
        context.log.warning(f"skipped {len(report.skipped)} bad records (per shard: {per_shard}); first: {report.skipped[:5]}")
    n_train = int(built.manifest["n_docs"].sum())
    return rec.finish(
        [layout.corpus, layout.shards, *held_files],
        {"train_docs": n_train, "heldout_docs": built.heldout.height, "skipped": len(report.skipped), "shards": built.manifest.height},
        {"corpus": cfg.corpus.path or cfg.corpus.hf_dataset or "builtin", "heldout_fraction": cfg.heldout_fraction, "seed": cfg.seed,
         "engine": cfg.engine},
        {"sources": dg.MetadataValue.md(built.stats.to_pandas().to_markdown(index=False)),
         "shards_validated": built.validated, "shards_reused": built.reused,
         "skipped_by_shard": dg.MetadataValue.json(report.skipped_by_shard)},
    )
