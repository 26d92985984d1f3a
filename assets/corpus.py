"""corpus: the validated documents (training split) and the held-out split in Paloma layout."""


import dagster as dg
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.common import SHARD_PARTITIONS, Recorder, StrataSettings
from assets.params import PARAM_CLASSES, asset_config
from pipeline.config import StrataConfig
from pipeline.data import stage
from pipeline.data.corpus import corpus_fingerprint, shard_key, shard_version, shard_versions, validate_shard
from pipeline.data.shard_docs import ShardDocs, manifest_shards
from pipeline.errors import StrataInputError
from pipeline.storage.layout import Layout


@dg.observable_source_asset(group_name="data", description="The raw corpus (shards, dataset or built-in); its data version is a hash of "
                                                          "every shard's content and the reading options.")
def raw_corpus(settings: StrataSettings) -> dg.DataVersion:
    return dg.DataVersion(corpus_fingerprint(settings.config().corpus))


@dg.observable_source_asset(group_name="data", partitions_def=SHARD_PARTITIONS,
                            description="One corpus shard per partition; its data version is a hash of the shard's bytes and the "
                                        "reading options.")
def raw_shards(context: dg.AssetExecutionContext, settings: StrataSettings) -> dg.DataVersionsByPartition:
    versions = shard_versions(settings.config().corpus)
    return dg.DataVersionsByPartition({k: dg.DataVersion(fp) for k, (_, fp) in versions.items()})


@dg.asset(group_name="data", deps=["raw_shards"], partitions_def=SHARD_PARTITIONS, code_version="1", kinds={"parquet"})
def corpus_shards(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Read and validate one corpus shard (a partition per shard file under ``corpus.path``, found by
    the ``strata_config`` sensor, ``strata run`` and ``strata status``) into
    ``corpus/shards/<fingerprint>-<split>.parquet`` (+ ``.json``, its report): records with content
    hash and held-out flag, on a Ray worker with ``engine: ray``. An unchanged shard is not read
    again; an appended or edited shard is the only partition to run. ``corpus`` gathers the shards."""
    rec = Recorder(context, duckdb, {})
    cfg, layout = settings.config(), settings.layout()
    unit, fp = shard_of(context.partition_key, cfg)
    out, info, reused = validate_shard(unit, fp, cfg.corpus, cfg.heldout_fraction, cfg.seed, layout.shard_dir("corpus"),
                                       engine=cfg.engine, ray_cfg=cfg.ray)
    return rec.finish(
        [out, out.with_suffix(".json")],
        {"records": info["n_read"], "skipped": len(info["skipped"])},
        {"shard": unit, "heldout_fraction": cfg.heldout_fraction, "seed": cfg.seed},
        {"fingerprint": fp, "reused": reused},
    )


def shard_of(partition_key: str, cfg: StrataConfig) -> tuple[str, str]:
    """(raw shard, content fingerprint) of a ``corpus_shard`` partition."""
    found = shard_version(cfg.corpus, partition_key)
    if found is None:
        raise StrataInputError(f"shard partition {partition_key!r} is not in the corpus any more",
                               path=str(cfg.corpus.path), fix="run `strata status` (it drops partitions of removed shards)")
    return found


def partition_docs(partition_key: str, cfg: StrataConfig, layout: Layout) -> ShardDocs:
    """The training rows of a ``corpus_shard`` partition, for the per-shard stages (its validated
    file, which ``corpus_shards`` wrote; validated here if missing)."""
    unit, fp = shard_of(partition_key, cfg)
    out, _, _ = validate_shard(unit, fp, cfg.corpus, cfg.heldout_fraction, cfg.seed, layout.shard_dir("corpus"),
                               engine=cfg.engine, ray_cfg=cfg.ray)
    return ShardDocs.of(unit, out)


def gathered_shards(layout: Layout, rec: Recorder, dep_asset: str) -> list[tuple[dict, ShardDocs]]:
    """Every shard of the corpus ``corpus`` gathered (``corpus/shards.parquet``) with its training
    rows; records each shard's partition of ``dep_asset`` as an input of ``rec``'s lineage row."""
    shards = manifest_shards(pl.read_parquet(layout.shards), layout.shard_dir("corpus"))
    rec.deps[dep_asset] = [shard_key(s.unit) for _, s in shards]
    return shards


CorpusParams = PARAM_CLASSES["corpus"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="data", deps=["raw_corpus", "corpus_shards"], code_version="2", kinds={"parquet"})
def corpus(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
           config: CorpusParams) -> dg.MaterializeResult:
    """Read and validate every corpus shard as a stream of batches; split off a seeded held-out set.

    Writes ``corpus.parquet`` (doc_id, id, source, subdomain, content_hash, shard, shard_row; the
    texts stay in the validated shards) for training, ``corpus/shards.parquet`` (one row per shard) and ``heldout/<source>/val/*.jsonl.gz``
    (Paloma layout) for evaluation. It gathers the validated shards of ``corpus_shards`` (kept
    under ``corpus/shards/`` by content fingerprint) and validates any shard still missing, so an
    unchanged shard is not read again. With ``engine: ray`` the shards are read
    and validated as Ray tasks (workers need read access to the raw shards).
    One call of ``pipeline.data.stage.build_stage``.
    """
    rec = Recorder(context, duckdb, {})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    params = stage.CorpusParams.from_config(cfg)
    return rec.finish_stage(stage.build_stage(layout, params, duckdb.get_connection, log=context.log.info, warn=context.log.warning))
