"""corpus: the validated documents (training split) and the held-out split in Paloma layout."""


import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import SHARD_PARTITIONS, Recorder, StrataSettings
from assets.params import PARAM_CLASSES, asset_config
from pipeline.data import stage
from pipeline.data.corpus import corpus_fingerprint, shard_versions


@dg.observable_source_asset(group_name="data", description="The raw corpus (shards, dataset or built-in); its data version is a hash of "
                                                          "every shard's content and the reading options.")
def raw_corpus(settings: StrataSettings) -> dg.DataVersion:
    return dg.DataVersion(corpus_fingerprint(settings.config().corpus))


@dg.observable_source_asset(group_name="data", partitions_def=SHARD_PARTITIONS,
                            description="One corpus shard (or group of small files: corpus.group_bytes) per partition; its data "
                                        "version is a hash of the shard's bytes and the reading options.")
def raw_shards(context: dg.AssetExecutionContext, settings: StrataSettings) -> dg.DataVersionsByPartition:
    versions = shard_versions(settings.config().corpus)
    return dg.DataVersionsByPartition({k: dg.DataVersion(fp) for k, (_, fp) in versions.items()})


@dg.asset(group_name="data", deps=["raw_shards"], partitions_def=SHARD_PARTITIONS, code_version="1", kinds={"parquet"})
def corpus_shards(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Read and validate one corpus shard (a partition per shard file under ``corpus.path``, found by
    the ``strata_config`` sensor, ``strata run`` and ``strata status``) into
    ``corpus/shards/<fingerprint>-<split>.parquet`` (+ ``.json``, its report): records with content
    hash and held-out flag, on a Ray worker with ``engine: ray``. An unchanged shard is not read
    again; an appended or edited shard is the only partition to run. ``corpus`` gathers the shards.
    One call of ``pipeline.data.stage.validate_corpus_shard``."""
    rec = Recorder(context, duckdb)
    cfg, layout = settings.config(), settings.layout()
    return rec.finish_stage(stage.validate_corpus_shard(layout, stage.CorpusShardParams.from_config(cfg), context.partition_key))


CorpusParams = PARAM_CLASSES["corpus"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="data", deps=["raw_corpus", "corpus_shards"], code_version="2", kinds={"parquet"})
def corpus(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
           config: CorpusParams) -> dg.MaterializeResult:
    """Read and validate every corpus shard as a stream of batches; split off a seeded held-out set.

    Writes ``corpus.parquet`` (doc_id, id, source, subdomain, content_hash, shard, shard_row, then
    the fields ``corpus.columns`` declares; the texts stay in the validated shards) for training,
    ``corpus/shards.parquet`` (one row per shard) and ``heldout/<source>/val/*.jsonl.gz``
    (Paloma layout) for evaluation. It gathers the validated shards of ``corpus_shards`` (kept
    under ``corpus/shards/`` by content fingerprint) and validates any shard still missing, so an
    unchanged shard is not read again. With ``engine: ray`` the shards are read
    and validated as Ray tasks (workers need read access to the raw shards).
    One call of ``pipeline.data.stage.build_stage``.
    """
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings, config), settings.layout()
    params = stage.CorpusParams.from_config(cfg)
    return rec.finish_stage(stage.build_stage(layout, params, duckdb.get_connection, log=context.log.info, warn=context.log.warning))
