"""The representation stage: seeded k-means over the documents' embeddings (``centroids``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from pipeline.stage import EngineParams, StageParams, StageResult, setting


@dataclass(frozen=True)
class EmbedParams(EngineParams):
    """How documents are embedded (``embedding_shards``)."""

    embed_method: str = setting()
    embed_model: str = setting()  # "" = the default model
    embed_max_tokens: int = setting()  # first N tokens of each document (0 = all)
    embed_batch_size: int = setting(versioned=False)  # a speed knob


@dataclass(frozen=True)
class CentroidParams(StageParams):
    """The k-means of the representation stage (``centroids``)."""

    k: int = setting()
    seed: int = setting()
    kmeans_iters: int = setting()
    pca_components: int = setting()
    kmeans_spherical: bool = setting()
    kmeans_max_points_per_centroid: int = setting()
    keep_centroids: bool = setting()
    embed: EmbedParams = setting(versioned=False, convert=EmbedParams)  # names the embeddings (embedding_shards' parameters)


def embed_key(params: EmbedParams) -> tuple[str, str]:
    """(embedding model path, the key naming its shard files)."""
    from pipeline.represent.embedding_shards import embedding_key
    from pipeline.represent.embeddings import default_model_path

    model = params.embed_model or default_model_path()
    return model, embedding_key(model, params.embed_max_tokens, params.embed_method)


def train_centroids(layout, params: CentroidParams) -> StageResult:
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
    model_params = {"k": params.k, "seed": params.seed, "iters": params.kmeans_iters, "pca": params.pca_components,
                    "spherical": params.kmeans_spherical, "max_points_per_centroid": params.kmeans_max_points_per_centroid,
                    "embeddings": embed_key(params.embed)[1]}
    model_dir = layout.inside("clusters", "model")
    saved = load_model(model_dir) if params.keep_centroids else None
    kept = saved is not None and keeps(saved[2], model_params, set(live)) and layout.centroids.is_file()
    if kept:
        meta = saved[2]
    else:
        cents, transform, backend = train_kmeans(
            emb, params.k, params.seed, params.kmeans_iters, pca=params.pca_components, spherical=params.kmeans_spherical,
            max_points_per_centroid=params.kmeans_max_points_per_centroid,
        )
        meta = {"params": model_params, "trained_shards": live, "backend": backend,
                "trained_on": int(min(emb.shape[0], params.k * params.kmeans_max_points_per_centroid))}
        meta["key"] = save_model(model_dir, cents, transform, meta)
        write_npy(cents, layout.centroids)
    files = sorted(p for p in model_dir.iterdir() if p.is_file())
    return StageResult(
        outputs=[layout.centroids, *files],
        rows={"clusters": int(np.load(layout.centroids, mmap_mode="r").shape[0]), "trained_on": meta["trained_on"]},
        parameters={"k": params.k, "seed": params.seed, "iters": params.kmeans_iters, "pca": params.pca_components,
                    "spherical": params.kmeans_spherical, "keep_centroids": params.keep_centroids},
        facts={"backend": meta["backend"], "trained_on": meta["trained_on"], "centroids": "kept" if kept else "trained",
               "model": meta["key"]},
    )
