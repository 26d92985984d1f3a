"""The representation stage: each corpus shard's embeddings (``embedding_shards``), gathered
(``embeddings``); seeded k-means over them (``centroids``); each shard's assignment to the nearest
centroid (``cluster_shards``), gathered (``clusters``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import polars as pl

from pipeline.data.gather import gather_shards, partition_shard, shard_facts
from pipeline.data.shard_docs import ShardDocs
from pipeline.data.stage import CorpusShardParams
from pipeline.data.token_shards import token_files, tokenizer_key
from pipeline.data.tokenizer import load_tokenizer
from pipeline.represent.cluster_shards import assign_shards, assignment_file
from pipeline.represent.clusters import keeps, load_model, save_model, train_kmeans
from pipeline.represent.embedding_index import open_embeddings, write_embedding_runs
from pipeline.represent.embedding_norms import NormRange, norms_file, shard_norms
from pipeline.represent.embedding_shards import embed_shards, embedding_file, embedding_key
from pipeline.represent.embeddings import default_model_path, same_tokenizer
from pipeline.stage import CheckFact, Connect, EngineParams, StageParams, StageResult, setting
from pipeline.storage.atomic import is_sidecar, write_npy, write_parquet
from pipeline.storage.warehouse import replace_rows


@dataclass(frozen=True)
class EmbedParams(EngineParams):
    """How documents are embedded (``embedding_shards``)."""

    embed_method: str = setting()
    embed_model: str = setting()  # "" = the default model
    embed_max_tokens: int = setting()  # first N tokens of each document (0 = all)
    embed_batch_size: int = setting(versioned=False)  # a speed knob
    corpus_shard: CorpusShardParams = setting(versioned=False, convert=CorpusShardParams)  # a partition's shard (corpus_shards')


@dataclass(frozen=True)
class AssignParams(EngineParams):
    """Assigning documents to the nearest centroid (``cluster_shards``, ``clusters``): where the work
    runs; the embeddings it reads (``embedding_shards``' parameters) and a partition's shard."""

    embed: EmbedParams = setting(versioned=False, convert=EmbedParams)
    corpus_shard: CorpusShardParams = setting(versioned=False, convert=CorpusShardParams)


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
    model = params.embed_model or default_model_path()
    return model, embedding_key(model, params.embed_max_tokens, params.embed_method)


def train_centroids(layout, params: CentroidParams) -> StageResult:
    """Seeded faiss k-means (spherical by default, optional PCA) on a seeded sample of
    ``k * kmeans_max_points_per_centroid`` embeddings: ``clusters/model/`` (centroids, PCA,
    ``model.json``) and ``clusters/centroids.npy``. With ``keep_centroids`` the saved model is kept
    when the corpus was only appended to (every shard it was trained on still there, unchanged)
    and the parameters are the same: its files, and so its data version, do not change."""
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
    files = sorted(p for p in model_dir.iterdir() if p.is_file() and not is_sidecar(p))
    return StageResult(
        outputs=[layout.centroids, *files],
        rows={"clusters": int(np.load(layout.centroids, mmap_mode="r").shape[0]), "trained_on": meta["trained_on"]},
        parameters={"k": params.k, "seed": params.seed, "iters": params.kmeans_iters, "pca": params.pca_components,
                    "spherical": params.kmeans_spherical, "keep_centroids": params.keep_centroids},
        facts={"backend": meta["backend"], "trained_on": meta["trained_on"], "centroids": "kept" if kept else "trained",
               "model": meta["key"]},
    )


def _token_store(layout, model: str) -> Callable[[ShardDocs], tuple] | None:
    """``shard -> its token files`` when the pipeline's tokenizer is the embedding model's (``shallow``
    then reads ids from the token store), else None."""
    tok_json = layout.tokenizer / "tokenizer.json"
    if not tok_json.is_file() or not same_tokenizer(model, tok_json.read_text(encoding="utf-8")):
        return None
    key = tokenizer_key(load_tokenizer(layout.tokenizer))
    return lambda shard: token_files(layout.shard_dir("tokens"), shard, key)


def _embed(layout, params: EmbedParams, shards: list[ShardDocs]) -> dict:
    """Embed every shard of ``shards`` whose file is missing (:func:`embed_shards`)."""
    model, _ = embed_key(params)
    return embed_shards(shards, params, model, layout.shard_dir("embeddings"), layout.inside("work", "embeddings"),
                        token_files=_token_store(layout, model) if params.embed_method == "shallow" else None)


def _embed_parameters(params: EmbedParams) -> dict:
    return {"method": params.embed_method, "model": params.embed_model or "all-MiniLM-L6-v2", "max_tokens": params.embed_max_tokens,
            "engine": params.engine, "shard_docs": params.shard_docs}


def embed_shard(layout, params: EmbedParams, partition_key: str) -> StageResult:
    """Embeddings of one corpus shard's training documents (``embed_method``: sentence =
    all-MiniLM-L6-v2 offline by default, shallow = mean input-embedding rows, deep = mean last hidden
    state), L2-normalized, over each document's first ``embed_max_tokens`` tokens:
    ``embeddings/shards/<validated>-<model>.npy``, in units of ``shard_docs`` documents on the
    configured ``engine``. ``shallow`` reads the shard's token files when the pipeline's tokenizer is the model's."""
    shard = partition_shard(layout, params.corpus_shard, partition_key)
    run = _embed(layout, params, [shard])
    out = embedding_file(layout.shard_dir("embeddings"), shard, embed_key(params)[1])
    return StageResult(outputs=[out] if shard.n_docs else [], rows={"documents": shard.n_docs},
                       parameters={"shard": shard.unit, **_embed_parameters(params)},
                       facts=shard_facts(shard, run, units=run["units"], from_token_store=run["from_token_store"]))


def gather_embeddings(layout, params: EmbedParams) -> StageResult:
    """Every training document's embedding (N x d float32, unit rows, doc_id order) as an index over
    the ``embedding_shards`` files, ``embeddings/runs.parquet`` (:mod:`pipeline.represent.embedding_index`:
    no copy of the rows; only the kept documents where ``corpus`` dropped some). A shard whose file
    is missing is embedded here, the same way (:func:`pipeline.data.gather.gather_shards`)."""
    key, shard_dir = embed_key(params)[1], layout.shard_dir("embeddings")
    g = gather_shards(layout, "embeddings", lambda docs: _embed(layout, params, docs),
                      lambda s: (embedding_file(shard_dir, s, key), norms_file(embedding_file(shard_dir, s, key))))
    n = write_embedding_runs([(embedding_file(shard_dir, s, key), rows) for _, s, rows in g.parts()], layout.embeddings)
    return StageResult(outputs=[layout.embeddings], rows={"documents": n, "dim": open_embeddings(layout).shape[1]},
                       parameters=_embed_parameters(params), facts=g.run, deps=g.deps("embedding_shards"))


def _assign(layout, params: AssignParams, shards: list[ShardDocs], cents, transform, model_key: str) -> dict:
    """Assign every shard of ``shards`` whose file is missing to the nearest of ``cents`` (:func:`assign_shards`)."""
    emb_dir, key = layout.shard_dir("embeddings"), embed_key(params.embed)[1]
    return assign_shards(shards, cents, transform, model_key, lambda s: embedding_file(emb_dir, s, key), layout.shard_dir("clusters"),
                         layout.inside("work", "clusters"), params)


def _model(layout):
    """The saved k-means model (centroids, transform, ``model.json``) that ``centroids`` wrote."""
    saved = load_model(layout.inside("clusters", "model"))
    if saved is None:
        raise RuntimeError(f"no k-means model under {layout.inside('clusters', 'model')}: materialize `centroids` first")
    return saved


def assign_shard(layout, params: AssignParams, partition_key: str) -> StageResult:
    """Each training document of one corpus shard assigned to its nearest centroid:
    ``clusters/shards/<validated>-<model>.npy`` (int32), in units of ``shard_docs`` rows on the
    configured ``engine``; named by the model, so kept centroids leave every old file in place."""
    shard = partition_shard(layout, params.corpus_shard, partition_key)
    cents, transform, meta = _model(layout)
    run = _assign(layout, params, [shard], cents, transform, meta["key"])
    out = assignment_file(layout.shard_dir("clusters"), shard, meta["key"])
    return StageResult(outputs=[out] if shard.n_docs else [], rows={"documents": shard.n_docs},
                       parameters={"shard": shard.unit, "engine": params.engine}, facts=shard_facts(shard, run, model=meta["key"]))


def gather_clusters(layout, params: AssignParams, connect: Connect) -> StageResult:
    """Every training document's cluster, ``clusters.parquet`` (doc_id, cluster): the ``cluster_shards``
    assignments gathered in corpus order (a shard whose file is missing is assigned here), and the
    cluster sizes in DuckDB ``cluster_sizes``."""
    cents, transform, meta = _model(layout)
    key, shard_dir = meta["key"], layout.shard_dir("clusters")
    g = gather_shards(layout, "clusters", lambda docs: _assign(layout, params, docs, cents, transform, key),
                      lambda s: (assignment_file(shard_dir, s, key),))
    parts = [(np.load(assignment_file(shard_dir, s, key)), rows) for _, s, rows in g.parts()]
    assign = np.concatenate([a if rows is None else a[rows] for a, rows in parts])  # 4 bytes a document
    df = pl.DataFrame({"doc_id": np.arange(assign.size, dtype=np.int64), "cluster": assign.astype(np.int32)})
    write_parquet(df, layout.clusters)
    sizes = df.group_by("cluster").agg(n_docs=pl.len()).sort("cluster")
    with connect() as con:
        replace_rows(con, "cluster_sizes", sizes, {})
    return StageResult(
        outputs=[layout.clusters],
        rows={"documents": df.height, "clusters": int(np.load(layout.centroids, mmap_mode="r").shape[0])},
        parameters={"model": key},
        facts={"largest_cluster_docs": int(sizes["n_docs"].max()), "smallest_cluster_docs": int(sizes["n_docs"].min()), "model": key,
               **{f"assign_{k}": v for k, v in g.run.items()}},
        deps=g.deps("cluster_shards"),
    )


def embeddings_normalized(layout) -> CheckFact:
    """The ``embeddings`` check: finite, unit-norm rows, over every row of the shard files the
    matrix indexes: the norm range ``embed_shards`` took while writing each file, where its record
    matches the file's bytes; else read from the file (:mod:`pipeline.represent.embedding_norms`)."""
    total, recorded = NormRange(), 0
    for path in dict.fromkeys(open_embeddings(layout).runs.paths):
        norms, from_record = shard_norms(path)
        total, recorded = total.merge(norms), recorded + from_record
    lo, hi = total.min_norm, total.max_norm
    ok = total.finite and abs(lo - 1.0) <= 1e-3 and abs(hi - 1.0) <= 1e-3
    return CheckFact("embeddings_normalized", bool(ok), {"min_norm": lo, "max_norm": hi, "shard_rows": total.rows,
                                                         "shards_from_records": recorded})


def clusters_cover_documents(layout) -> CheckFact:
    """The ``clusters`` check: every training document has exactly one cluster in [0, k), k the
    number of centroids the model was built with (a launchpad run may override ``k``)."""
    cl = pl.read_parquet(layout.clusters)
    n_docs = pl.read_parquet(layout.corpus, columns=["doc_id"]).height
    k = np.load(layout.centroids, mmap_mode="r").shape[0]
    ok = cl.height == n_docs and cl["doc_id"].n_unique() == n_docs and cl["cluster"].min() >= 0 and cl["cluster"].max() < k
    return CheckFact("clusters_cover_documents", bool(ok), {"documents": n_docs, "assigned": cl.height})
