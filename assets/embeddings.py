"""embedding_shards, embeddings, centroids, cluster_shards and clusters: sentence embeddings of each
document per corpus shard, seeded faiss k-means on a sample, each shard's assignment, gathered."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.common import SHARD_PARTITIONS, Recorder, StrataSettings
from assets.params import PARAM_CLASSES, asset_config
from pipeline.represent import stage

EmbeddingShardsParams = PARAM_CLASSES["embedding_shards"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="representation", deps=["corpus_shards", "token_shards"], partitions_def=SHARD_PARTITIONS, code_version="1",
          kinds={"numpy", "pytorch"})
def embedding_shards(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
                     config: EmbeddingShardsParams) -> dg.MaterializeResult:
    """Embeddings of one corpus shard's training documents (``embed_method``: sentence =
    all-MiniLM-L6-v2 offline by default, shallow = mean input-embedding rows, deep = mean last hidden
    state), L2-normalized, over each document's first ``embed_max_tokens`` tokens:
    ``embeddings/shards/<validated>-<model>.npy``. In units of ``shard_docs`` documents on the
    configured ``engine``: in this process, or on Ray model actors (one per GPU, CPU actors
    otherwise); both give identical bytes. ``shallow`` reads the shard's token files instead of
    tokenizing again when the pipeline's tokenizer is the model's. One call of
    ``pipeline.represent.stage.embed_shard``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings, config), settings.layout()
    return rec.finish_stage(stage.embed_shard(layout, stage.EmbedParams.from_config(cfg), context.partition_key))


@dg.asset(group_name="representation", deps=["corpus", "embedding_shards"], code_version="7", kinds={"numpy"})
def embeddings(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Every training document's embedding (N x d float32, unit rows, doc_id order) as an index over
    the ``embedding_shards`` files, ``embeddings/runs.parquet`` (:mod:`pipeline.represent.embedding_index`:
    no copy of the rows; only the kept documents where ``corpus`` dropped some), read with
    ``open_embeddings``. A shard whose file is missing (its partition was not run) is embedded
    here, the same way. One call of ``pipeline.represent.stage.gather_embeddings``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings), settings.layout()
    return rec.finish_stage(stage.gather_embeddings(layout, stage.EmbedParams.from_config(cfg)))


CentroidsParams = PARAM_CLASSES["centroids"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="representation", deps=["embeddings"], code_version="1", kinds={"numpy"})
def centroids(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
              config: CentroidsParams) -> dg.MaterializeResult:
    """Seeded faiss k-means (spherical by default, optional PCA) trained on a seeded sample of
    ``k * kmeans_max_points_per_centroid`` embeddings: ``clusters/model/`` (centroids, PCA,
    ``model.json``: parameters and the shards it was trained on) and ``clusters/centroids.npy``.

    When the corpus was only appended to (every shard the model was trained on is still there,
    unchanged) and the parameters are the same, the model is kept (``keep_centroids``, default on):
    its files, and so its data version, do not change, and no old ``cluster_shards`` partition is
    stale. ``keep_centroids: false`` retrains. One call of ``pipeline.represent.stage.train_centroids``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings, config), settings.layout()
    return rec.finish_stage(stage.train_centroids(layout, stage.CentroidParams.from_config(cfg)))


@dg.asset(group_name="representation", deps=["centroids", "embedding_shards"], partitions_def=SHARD_PARTITIONS, code_version="1",
          kinds={"numpy"})
def cluster_shards(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Each training document of one corpus shard assigned to its nearest centroid:
    ``clusters/shards/<validated>-<model>.npy`` (int32), in units of ``shard_docs`` rows on the
    configured ``engine``. Named by the model, so kept centroids leave every old partition fresh.
    One call of ``pipeline.represent.stage.assign_shard``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings), settings.layout()
    return rec.finish_stage(stage.assign_shard(layout, stage.AssignParams.from_config(cfg), context.partition_key))


@dg.asset(group_name="representation", deps=["corpus", "centroids", "cluster_shards"], code_version="5", kinds={"parquet"})
def clusters(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Every training document's cluster, ``clusters.parquet`` (doc_id, cluster): the ``cluster_shards``
    assignments gathered in corpus order (a shard whose file is missing is assigned here), plus the
    cluster sizes in DuckDB. One call of ``pipeline.represent.stage.gather_clusters``."""
    rec = Recorder(context, duckdb)
    cfg, layout = asset_config(context, settings), settings.layout()
    return rec.finish_stage(stage.gather_clusters(layout, stage.AssignParams.from_config(cfg), duckdb.get_connection))
