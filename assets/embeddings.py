"""embedding_shards, embeddings, centroids, cluster_shards and clusters: sentence embeddings of each
document per corpus shard, seeded faiss k-means on a sample, each shard's assignment, gathered."""

import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.common import SHARD_PARTITIONS, Recorder, StrataSettings
from assets.corpus import gathered_shards, partition_docs
from assets.params import PARAM_CLASSES, asset_config
from pipeline.data.shard_docs import ShardDocs, kept_rows, prune
from pipeline.data.token_shards import token_files, tokenizer_key
from pipeline.data.tokenizer import load_tokenizer
from pipeline.represent import stage
from pipeline.represent.cluster_shards import assign_shards, assignment_file
from pipeline.represent.clusters import load_model
from pipeline.represent.embedding_index import open_embeddings, write_embedding_runs
from pipeline.represent.embedding_norms import norms_file
from pipeline.represent.embedding_shards import embed_shards, embedding_file
from pipeline.represent.embeddings import same_tokenizer
from pipeline.storage.atomic import write_parquet
from pipeline.storage.warehouse import replace_rows

EmbeddingShardsParams = PARAM_CLASSES["embedding_shards"]  # launchpad: this asset's parameters (assets/params.py)


def _token_store(layout, model: str):
    """``shard -> its token files`` when the pipeline's tokenizer is the embedding model's (``shallow``
    then reads ids from the token store), else None."""
    tok_json = layout.tokenizer / "tokenizer.json"
    if not tok_json.is_file() or not same_tokenizer(model, tok_json.read_text(encoding="utf-8")):
        return None
    key = tokenizer_key(load_tokenizer(layout.tokenizer))
    return lambda shard: token_files(layout.shard_dir("tokens"), shard, key)


def _embed(cfg, layout, shards: list[ShardDocs]) -> tuple[dict, str]:
    model, key = stage.embed_key(stage.EmbedParams.from_config(cfg))
    run = embed_shards(shards, cfg, model, layout.shard_dir("embeddings"), layout.inside("work", "embeddings"),
                       token_files=_token_store(layout, model) if cfg.embed_method == "shallow" else None)
    return run, key


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
    tokenizing again when the pipeline's tokenizer is the model's."""
    rec = Recorder(context, duckdb, {"corpus_shards": context.partition_key, "token_shards": context.partition_key})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    shard = partition_docs(context.partition_key, cfg, layout)
    run, key = _embed(cfg, layout, [shard])
    out = embedding_file(layout.shard_dir("embeddings"), shard, key)
    return rec.finish(
        [out] if shard.n_docs else [],
        {"documents": shard.n_docs},
        {"shard": shard.unit, "method": cfg.embed_method, "model": cfg.embed_model or "all-MiniLM-L6-v2",
         "max_tokens": cfg.embed_max_tokens, "engine": cfg.engine, "shard_docs": cfg.shard_docs},
        {"validated": shard.name, "reused": run["shards_reused"] > 0 or shard.n_docs == 0, "units": run["units"],
         "from_token_store": run["from_token_store"]},
    )


@dg.asset(group_name="representation", deps=["corpus", "embedding_shards"], code_version="7", kinds={"numpy"})
def embeddings(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Every training document's embedding (N x d float32, unit rows, doc_id order) as an index over
    the ``embedding_shards`` files, ``embeddings/runs.parquet`` (:mod:`pipeline.represent.embedding_index`:
    no copy of the rows; only the kept documents where ``corpus`` dropped some), read with
    ``open_embeddings``. A shard whose file is missing (its partition was not run) is embedded
    here, the same way."""
    rec = Recorder(context, duckdb, {"corpus": None})
    cfg, layout = asset_config(context, settings), settings.layout()
    shards = gathered_shards(layout, rec, "embedding_shards")
    run, key = _embed(cfg, layout, [s for _, s in shards])
    shard_dir = layout.shard_dir("embeddings")
    files = [embedding_file(shard_dir, s, key) for _, s in shards]
    prune(shard_dir, {f.name for e in files for f in (e, norms_file(e))})
    parts = [(embedding_file(shard_dir, s, key), kept_rows(layout.corpus, row, s)) for row, s in shards if int(row["n_docs"])]
    n = write_embedding_runs(parts, layout.embeddings)
    return rec.finish(
        [layout.embeddings],
        {"documents": n, "dim": open_embeddings(layout).shape[1]},
        {"method": cfg.embed_method, "model": cfg.embed_model or "all-MiniLM-L6-v2", "max_tokens": cfg.embed_max_tokens,
         "engine": cfg.engine, "shard_docs": cfg.shard_docs},
        run,
    )


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
    rec = Recorder(context, duckdb, {"embeddings": None})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    return rec.finish_stage(stage.train_centroids(layout, stage.CentroidParams.from_config(cfg)))


def _assign(layout, cfg, shards: list[ShardDocs]) -> tuple[dict, str]:
    saved = load_model(layout.inside("clusters", "model"))
    if saved is None:
        raise RuntimeError(f"no k-means model under {layout.inside('clusters', 'model')}: materialize `centroids` first")
    cents, transform, meta = saved
    _, key = stage.embed_key(stage.EmbedParams.from_config(cfg))
    emb_dir = layout.shard_dir("embeddings")
    run = assign_shards(shards, cents, transform, meta["key"], lambda s: embedding_file(emb_dir, s, key), layout.shard_dir("clusters"),
                        layout.inside("work", "clusters"), cfg)
    return run, meta["key"]


@dg.asset(group_name="representation", deps=["centroids", "embedding_shards"], partitions_def=SHARD_PARTITIONS, code_version="1",
          kinds={"numpy"})
def cluster_shards(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Each training document of one corpus shard assigned to its nearest centroid:
    ``clusters/shards/<validated>-<model>.npy`` (int32), in units of ``shard_docs`` rows on the
    configured ``engine``. Named by the model, so kept centroids leave every old partition fresh."""
    rec = Recorder(context, duckdb, {"centroids": None, "embedding_shards": context.partition_key})
    cfg, layout = asset_config(context, settings), settings.layout()
    shard = partition_docs(context.partition_key, cfg, layout)
    run, key = _assign(layout, cfg, [shard])
    out = assignment_file(layout.shard_dir("clusters"), shard, key)
    return rec.finish([out] if shard.n_docs else [], {"documents": shard.n_docs}, {"shard": shard.unit, "engine": cfg.engine},
                      {"validated": shard.name, "reused": run["shards_reused"] > 0 or shard.n_docs == 0, "model": key})


@dg.asset(group_name="representation", deps=["corpus", "centroids", "cluster_shards"], code_version="5", kinds={"parquet"})
def clusters(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource) -> dg.MaterializeResult:
    """Every training document's cluster, ``clusters.parquet`` (doc_id, cluster): the ``cluster_shards``
    assignments gathered in corpus order (a shard whose file is missing is assigned here), plus the
    cluster sizes in DuckDB."""
    rec = Recorder(context, duckdb, {"corpus": None, "centroids": None})
    cfg, layout = asset_config(context, settings), settings.layout()
    shards = gathered_shards(layout, rec, "cluster_shards")
    run, key = _assign(layout, cfg, [s for _, s in shards])
    shard_dir = layout.shard_dir("clusters")
    prune(shard_dir, {assignment_file(shard_dir, s, key).name for _, s in shards})
    parts = [(np.load(assignment_file(shard_dir, s, key)), kept_rows(layout.corpus, row, s)) for row, s in shards if int(row["n_docs"])]
    assign = np.concatenate([a if rows is None else a[rows] for a, rows in parts])  # 4 bytes a document
    df = pl.DataFrame({"doc_id": np.arange(assign.size, dtype=np.int64), "cluster": assign.astype(np.int32)})
    write_parquet(df, layout.clusters)
    sizes = df.group_by("cluster").agg(n_docs=pl.len()).sort("cluster")
    with duckdb.get_connection() as con:
        replace_rows(con, "cluster_sizes", sizes, {})
    return rec.finish(
        [layout.clusters],
        {"documents": df.height, "clusters": int(np.load(layout.centroids, mmap_mode="r").shape[0])},
        {"model": key},
        {"largest_cluster_docs": int(sizes["n_docs"].max()), "smallest_cluster_docs": int(sizes["n_docs"].min()), "model": key,
         **{f"assign_{k}": v for k, v in run.items()}},
    )
