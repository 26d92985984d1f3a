"""The representation stage: seeded k-means over the documents' embeddings (``centroids``)."""

from __future__ import annotations

import numpy as np
import polars as pl

from pipeline.stage import StageResult


def embed_key(cfg) -> tuple[str, str]:
    """(embedding model path, the key naming its shard files)."""
    from pipeline.represent.embedding_shards import embedding_key
    from pipeline.represent.embeddings import default_model_path

    model = cfg.embed_model or default_model_path()
    return model, embedding_key(model, cfg.embed_max_tokens, cfg.embed_method)


def train_centroids(layout, cfg) -> StageResult:
    """Seeded faiss k-means (spherical by default, optional PCA) on a seeded sample of
    ``k * kmeans_max_points_per_centroid`` embeddings: ``clusters/model/`` (centroids, PCA,
    ``model.json``) and ``clusters/centroids.npy``. With ``keep_centroids`` the saved model is kept
    when the corpus was only appended to (every shard it was trained on still there, unchanged)
    and the parameters are the same: its files, and so its data version, do not change."""
    from pipeline.represent.clusters import keeps, load_model, save_model, train_kmeans
    from pipeline.represent.embedding_index import open_embeddings
    from pipeline.storage.atomic import write_npy

    emb = open_embeddings(layout)
    live = [row["docs_digest"] for row in pl.read_parquet(layout.shards).to_dicts() if int(row["n_docs"])]
    params = {"k": cfg.k, "seed": cfg.seed, "iters": cfg.kmeans_iters, "pca": cfg.pca_components, "spherical": cfg.kmeans_spherical,
              "max_points_per_centroid": cfg.kmeans_max_points_per_centroid, "embeddings": embed_key(cfg)[1]}
    model_dir = layout.inside("clusters", "model")
    saved = load_model(model_dir) if cfg.keep_centroids else None
    kept = saved is not None and keeps(saved[2], params, set(live)) and layout.centroids.is_file()
    if kept:
        meta = saved[2]
    else:
        cents, transform, backend = train_kmeans(
            emb, cfg.k, cfg.seed, cfg.kmeans_iters, pca=cfg.pca_components, spherical=cfg.kmeans_spherical,
            max_points_per_centroid=cfg.kmeans_max_points_per_centroid,
        )
        meta = {"params": params, "trained_shards": live, "backend": backend,
                "trained_on": int(min(emb.shape[0], cfg.k * cfg.kmeans_max_points_per_centroid))}
        meta["key"] = save_model(model_dir, cents, transform, meta)
        write_npy(cents, layout.centroids)
    files = sorted(p for p in model_dir.iterdir() if p.is_file())
    return StageResult(
        [layout.centroids, *files],
        {"clusters": int(np.load(layout.centroids, mmap_mode="r").shape[0]), "trained_on": meta["trained_on"]},
        {"k": cfg.k, "seed": cfg.seed, "iters": cfg.kmeans_iters, "pca": cfg.pca_components, "spherical": cfg.kmeans_spherical,
         "keep_centroids": cfg.keep_centroids},
        {"backend": meta["backend"], "trained_on": meta["trained_on"], "centroids": "kept" if kept else "trained", "model": meta["key"]},
    )
