"""embeddings and clusters: sentence embeddings of each document and seeded faiss k-means."""

import functools

import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.params import PARAM_CLASSES, asset_config
from assets.common import Recorder, StrataSettings
from pipeline.represent.clusters import assign_unit, keeps, load_model, save_model, train_kmeans
from pipeline.data.tokenizer import load_tokenizer
from pipeline.data.tokens import token_dtype_of
from pipeline.distributed.text_shards import embed_unit, embed_unit_from_ids, load_unit, map_corpus_shards, prune, read_docs
from pipeline.storage.fingerprints import embedding_fingerprint, fingerprint_digest, tokenizer_fingerprint
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
    live = [s for s in manifest if int(s["n_docs"])]
    token_files = _token_shards(layout, live, model) if cfg.embed_method == "shallow" else None
    from_store = token_files is not None

    def out(shard: dict):
        return shard_dir / f"{shard['docs_digest']}-{key}.npy"

    def assemble(shard: dict, unit_files) -> None:
        write_rows((load_unit(f)[0] for f in unit_files), int(shard["n_docs"]), out(shard))

    if token_files is not None:
        starts = np.array([int(s["doc_start"]) for s in live], dtype=np.int64)

        @functools.lru_cache(maxsize=1)  # units come shard by shard: read each shard's counts once
        def shard_store(i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            bin_path, stats_path = token_files[i]
            n_all = pl.read_parquet(stats_path, columns=["n_tokens"])["n_tokens"].to_numpy()
            offsets = np.concatenate([[0], np.cumsum(n_all + 1)])
            return np.memmap(bin_path, dtype=token_dtype_of(bin_path, offsets), mode="r"), offsets, n_all

        def unit_args(a: int, b: int) -> tuple:
            i = int(np.searchsorted(starts, a, side="right")) - 1
            store, offsets, n_all = shard_store(i)
            lo, hi = a - int(starts[i]), b - int(starts[i])
            keep = np.minimum(n_all[lo:hi], cfg.embed_max_tokens) if cfg.embed_max_tokens > 0 else n_all[lo:hi]
            ids = np.concatenate([store[o : o + k] for o, k in zip(offsets[lo:hi], keep)])
            return (model, cfg.embed_max_tokens, ids, keep)

        fn = embed_unit_from_ids
    else:
        args = (cfg.embed_method, cfg.embed_model, cfg.embed_max_tokens, cfg.embed_batch_size, False)

        def unit_args(a: int, b: int) -> tuple:
            return (*args, read_docs(layout.corpus, a, b)["text"].to_list())

        fn = embed_unit
    run = map_corpus_shards(manifest, fn, unit_args, assemble, lambda s: out(s).is_file(), stage="embeddings", key=key,
                            work_dir=layout.inside("work", "embeddings"), cfg=cfg, actors=not from_store)
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


def _token_shards(layout, shards: list[dict], model: str) -> list[tuple] | None:
    """The token store's per-shard files for these shards when the pipeline's tokenizer is the
    embedding model's and every shard is tokenized (files named by the shard's documents and the
    tokenizer, so they cannot be stale), else None."""
    tok_json = layout.tokenizer / "tokenizer.json"
    if not tok_json.is_file() or not same_tokenizer(model, tok_json.read_text(encoding="utf-8")):
        return None
    key = fingerprint_digest(tokenizer_fingerprint(load_tokenizer(layout.tokenizer)))
    files = [(layout.shard_dir("tokens") / f"{s['docs_digest']}-{key}.bin", layout.shard_dir("tokens") / f"{s['docs_digest']}-{key}.parquet")
             for s in shards]
    return files if all(b.is_file() and p.is_file() for b, p in files) else None


ClustersParams = PARAM_CLASSES["clusters"]  # launchpad: this asset's parameters (assets/params.py)


@dg.asset(group_name="representation", deps=["embeddings"], code_version="4", kinds={"parquet"})
def clusters(context: dg.AssetExecutionContext, settings: StrataSettings, duckdb: DuckDBResource,
             config: ClustersParams) -> dg.MaterializeResult:
    """Seeded faiss k-means (spherical by default, optional PCA) trained on a seeded sample of
    ``k * kmeans_max_points_per_centroid`` embeddings, then every document assigned to its nearest
    centroid: ``clusters.parquet`` (doc_id, cluster) + ``centroids.npy``.

    The trained model is kept in ``clusters/model/``. When the corpus was only appended to (every
    shard it was trained on is still there, unchanged) and the parameters are the same, it is kept
    (``keep_centroids``, default on) and only the new shards are assigned; ``keep_centroids: false``
    retrains. Assignment is per corpus shard (``clusters/shards/<docs>-<model>.npy``, in units of
    ``shard_docs`` rows on the configured ``engine``), so a kept model reassigns nothing old."""
    rec = Recorder(context, duckdb, {"embeddings": None})
    cfg, layout = asset_config(context, settings, config), settings.layout()
    emb = np.load(layout.embeddings, mmap_mode="r")
    live = [s for s in pl.read_parquet(layout.shards).to_dicts() if int(s["n_docs"])]
    model = cfg.embed_model or default_model_path()
    params = {"k": cfg.k, "seed": cfg.seed, "iters": cfg.kmeans_iters, "pca": cfg.pca_components, "spherical": cfg.kmeans_spherical,
              "max_points_per_centroid": cfg.kmeans_max_points_per_centroid,
              "embeddings": fingerprint_digest(embedding_fingerprint(model, cfg.embed_max_tokens, method=cfg.embed_method,
                                                                     implementation=IMPLEMENTATION))}
    model_dir = layout.inside("clusters", "model")
    saved = load_model(model_dir) if cfg.keep_centroids else None
    kept = saved is not None and keeps(saved[2], params, {s["docs_digest"] for s in live})
    if kept:
        centroids, transform, meta = saved
        key, backend, trained_on = meta["key"], meta["backend"], meta["trained_on"]
    else:
        centroids, transform, backend = train_kmeans(
            emb, cfg.k, cfg.seed, cfg.kmeans_iters, pca=cfg.pca_components, spherical=cfg.kmeans_spherical,
            max_points_per_centroid=cfg.kmeans_max_points_per_centroid,
        )
        trained_on = int(min(emb.shape[0], cfg.k * cfg.kmeans_max_points_per_centroid))
        key = save_model(model_dir, centroids, transform, {"params": params, "trained_shards": [s["docs_digest"] for s in live],
                                                           "backend": backend, "trained_on": trained_on})
    shard_dir = layout.shard_dir("clusters")

    def out(shard: dict):
        return shard_dir / f"{shard['docs_digest']}-{key}.npy"

    run = map_corpus_shards(
        live, assign_unit, lambda a, b: (centroids, transform.pca, transform.spherical, np.asarray(emb[a:b])),
        lambda shard, files: write_npy(np.concatenate([load_unit(f)[0] for f in files]), out(shard)),
        lambda s: out(s).is_file(), stage="clusters", key=key, work_dir=layout.inside("work", "clusters"), cfg=cfg,
    )
    prune(shard_dir, {out(s).name for s in live})
    assign = np.concatenate([np.load(out(s)) for s in live])
    df = pl.DataFrame({"doc_id": np.arange(assign.size, dtype=np.int64), "cluster": assign.astype(np.int32)})
    write_parquet(df, layout.clusters)
    write_npy(centroids, layout.centroids)
    sizes = df.group_by("cluster").agg(n_docs=pl.len()).sort("cluster")
    with duckdb.get_connection() as con:
        replace_rows(con, "cluster_sizes", sizes, {})
    return rec.finish(
        [layout.clusters, layout.centroids],
        {"documents": df.height, "clusters": cfg.k},
        {"k": cfg.k, "seed": cfg.seed, "iters": cfg.kmeans_iters, "pca": cfg.pca_components, "spherical": cfg.kmeans_spherical,
         "keep_centroids": cfg.keep_centroids},
        {"largest_cluster_docs": int(sizes["n_docs"].max()), "smallest_cluster_docs": int(sizes["n_docs"].min()),
         "backend": backend, "trained_on": trained_on, "centroids": "kept" if kept else "trained", "model": key,
         **{f"assign_{k}": v for k, v in run.items()}},
    )
