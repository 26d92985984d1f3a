"""embeddings and clusters: sentence embeddings of each document and seeded faiss k-means."""


import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.params import PARAM_CLASSES, asset_config
from assets.common import Recorder, StrataSettings
from pipeline.represent.clusters import assign_clusters, train_kmeans
from pipeline.distributed.text_shards import clear_shards, embed_shard, map_text_shards
from pipeline.storage.cache import HashCache, cached_embed, embedding_fingerprint
from pipeline.represent.embeddings import IMPLEMENTATION, default_model_path
from pipeline.storage.atomic import write_npy, write_parquet
from pipeline.storage.warehouse import replace_rows


EmbeddingsParams = PARAM_CLASSES["embeddings"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="representation", deps=["corpus"], code_version="4", kinds={"numpy", "pytorch"})
def embeddings(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
               config: EmbeddingsParams) -> dg.MaterializeResult:
    """Document embeddings (``embed_method``: sentence = all-MiniLM-L6-v2 offline by default,
    shallow = mean input-embedding rows, deep = mean last hidden state), L2-normalized, over
    each document's first ``embed_max_tokens`` tokens. Cached per content hash (``cache/embeddings``):
    a rerun embeds only new or edited documents. The misses are embedded in shards of
    ``shard_docs`` documents on the configured ``engine``: in this process, or on Ray model actors
    (one per GPU, CPU actors otherwise); both give identical bytes."""
    rec = Recorder(context, duckdb, {"corpus": None})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    df = pl.read_parquet(layout.corpus, columns=["text", "content_hash"])
    hashes = df["content_hash"].to_list()
    fingerprint = embedding_fingerprint(cfg.embed_model or default_model_path(), cfg.embed_max_tokens, method=cfg.embed_method,
                                        implementation=IMPLEMENTATION)
    cache = HashCache(layout.inside("cache"), "embeddings", fingerprint, np.float32, 0)
    work = layout.inside("work", "embeddings")
    shard_stats: dict[str, int] = {}
    args = (cfg.embed_method, cfg.embed_model, cfg.embed_max_tokens, cfg.embed_batch_size, cfg.engine == "local")
    emb, computed = cached_embed(
        lambda texts: np.concatenate(map_text_shards(embed_shard, args, texts, stage="embeddings", fingerprint=fingerprint, stats=shard_stats,
                                                     work_dir=work, cfg=cfg, actors=True)),
        df["text"].to_list(), hashes, cache,
    )
    cache.prune(hashes)
    clear_shards(work, "embeddings")
    write_npy(emb, layout.embeddings)
    return rec.finish(
        [layout.embeddings],
        {"documents": emb.shape[0], "dim": emb.shape[1]},
        {"method": cfg.embed_method, "model": cfg.embed_model or "all-MiniLM-L6-v2", "max_tokens": cfg.embed_max_tokens,
         "engine": cfg.engine, "shard_docs": cfg.shard_docs},
        {"embedded": computed, "from_cache": len(hashes) - computed, **shard_stats},
    )


ClustersParams = PARAM_CLASSES["clusters"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="representation", deps=["embeddings"], code_version="3", kinds={"parquet"})
def clusters(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
             config: ClustersParams) -> dg.MaterializeResult:
    """Seeded faiss k-means (spherical by default, optional PCA) trained on a seeded sample of
    ``k * kmeans_max_points_per_centroid`` embeddings, then every document assigned in batches
    from the memory-mapped matrix: ``clusters.parquet`` (doc_id, cluster) + centroids."""
    rec = Recorder(context, duckdb, {"embeddings": None})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    emb = np.load(layout.embeddings, mmap_mode="r")
    centroids, transform, backend = train_kmeans(
        emb, cfg.k, cfg.seed, cfg.kmeans_iters, pca=cfg.pca_components, spherical=cfg.kmeans_spherical,
        max_points_per_centroid=cfg.kmeans_max_points_per_centroid,
    )
    assign = assign_clusters(emb, centroids, transform, cfg.kmeans_spherical)
    df = pl.DataFrame({"doc_id": np.arange(assign.size, dtype=np.int64), "cluster": assign.astype(np.int32)})
    write_parquet(df, layout.clusters)
    write_npy(centroids, layout.centroids)
    sizes = df.group_by("cluster").agg(n_docs=pl.len()).sort("cluster")
    with duckdb.get_connection() as con:
        replace_rows(con, "cluster_sizes", sizes, {})
    return rec.finish(
        [layout.clusters, layout.centroids],
        {"documents": df.height, "clusters": cfg.k},
        {"k": cfg.k, "seed": cfg.seed, "iters": cfg.kmeans_iters, "pca": cfg.pca_components, "spherical": cfg.kmeans_spherical},
        {"largest_cluster_docs": int(sizes["n_docs"].max()), "smallest_cluster_docs": int(sizes["n_docs"].min()),
         "backend": backend, "trained_on": int(min(emb.shape[0], cfg.k * cfg.kmeans_max_points_per_centroid))},
    )
