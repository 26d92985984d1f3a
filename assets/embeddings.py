"""embeddings and clusters: sentence embeddings of each document and seeded faiss k-means."""


import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.params import PARAM_CLASSES, asset_config
from assets.common import Recorder, StrataSettings
from pipeline.represent.clusters import assign_clusters, train_kmeans
from pipeline.data.tokens import open_tokens
from pipeline.distributed.text_shards import embed_unit, embed_unit_from_ids, load_unit, map_corpus_shards, prune, read_docs
from pipeline.storage.fingerprints import embedding_fingerprint, fingerprint_digest
from pipeline.represent.embeddings import IMPLEMENTATION, default_model_path, same_tokenizer
from pipeline.storage.atomic import write_npy, write_parquet, write_rows
from pipeline.storage.warehouse import replace_rows


EmbeddingsParams = PARAM_CLASSES["embeddings"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="representation", deps=["corpus", "tokens"], code_version="5", kinds={"numpy", "pytorch"})
def embeddings(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
               config: EmbeddingsParams) -> dg.MaterializeResult:
    """Document embeddings (``embed_method``: sentence = all-MiniLM-L6-v2 offline by default,
    shallow = mean input-embedding rows, deep = mean last hidden state), L2-normalized, over
    each document's first ``embed_max_tokens`` tokens.

    Each corpus shard is embedded on its own into ``embeddings/shards/<docs>-<model>.npy``, in
    units of ``shard_docs`` documents on the configured ``engine``: in this process, or on Ray
    model actors (one per GPU, CPU actors otherwise); both give identical bytes. A rerun embeds
    only new or edited shards. ``shallow`` reads the token store instead of tokenizing again when
    the pipeline's tokenizer is the model's. ``embeddings.npy`` is the shards' rows in doc_id
    order, written through a memory map (never whole in RAM)."""
    rec = Recorder(context, duckdb, {"corpus": None, "tokens": None})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    model = cfg.embed_model or default_model_path()
    key = fingerprint_digest(embedding_fingerprint(model, cfg.embed_max_tokens, method=cfg.embed_method, implementation=IMPLEMENTATION))
    manifest = pl.read_parquet(layout.shards).to_dicts()
    shard_dir = layout.shard_dir("embeddings")
    shard_dir.mkdir(parents=True, exist_ok=True)
    from_store = cfg.embed_method == "shallow" and same_tokenizer(model, (layout.tokenizer / "tokenizer.json").read_text(encoding="utf-8"))

    def out(shard: dict):
        return shard_dir / f"{shard['docs_digest']}-{key}.npy"

    def assemble(shard: dict, unit_files) -> None:
        write_rows((load_unit(f)[0] for f in unit_files), int(shard["n_docs"]), out(shard))

    if from_store:
        store, offsets = open_tokens(layout.tokens, layout.doc_offsets)

        def unit_args(a: int, b: int) -> tuple:
            n_tokens = np.diff(offsets[a : b + 1]) - 1
            keep = np.minimum(n_tokens, cfg.embed_max_tokens) if cfg.embed_max_tokens > 0 else n_tokens
            ids = np.concatenate([store[o : o + k] for o, k in zip(offsets[a:b], keep)])
            return (model, cfg.embed_max_tokens, ids, keep)

        fn = embed_unit_from_ids
    else:
        args = (cfg.embed_method, cfg.embed_model, cfg.embed_max_tokens, cfg.embed_batch_size, False)

        def unit_args(a: int, b: int) -> tuple:
            return (*args, read_docs(layout.corpus, a, b)["text"].to_list())

        fn = embed_unit
    run = map_corpus_shards(manifest, fn, unit_args, assemble, lambda s: out(s).is_file(), stage="embeddings", key=key,
                            work_dir=layout.inside("work", "embeddings"), cfg=cfg, actors=not from_store)
    live = [s for s in manifest if int(s["n_docs"])]
    prune(shard_dir, {out(s).name for s in live})
    parts = [np.load(out(s), mmap_mode="r") for s in live]
    n = sum(p.shape[0] for p in parts)
    write_rows((p[a : a + (1 << 16)] for p in parts for a in range(0, p.shape[0], 1 << 16)), n, layout.embeddings)
    return rec.finish(
        [layout.embeddings],
        {"documents": n, "dim": int(parts[0].shape[1])},
        {"method": cfg.embed_method, "model": cfg.embed_model or "all-MiniLM-L6-v2", "max_tokens": cfg.embed_max_tokens,
         "engine": cfg.engine, "shard_docs": cfg.shard_docs},
        {**run, "from_token_store": bool(from_store)},
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
