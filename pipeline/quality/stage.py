"""The quality stage: each corpus shard's documents scored by the configured scorer
(``quality_shards``, :mod:`pipeline.quality.shards`), then gathered (``quality``) into
``quality/documents.parquet`` (doc_id, quality, removed): the documents' ``quality`` column, which
the ordering reads like a column of ``documents.parquet`` (a family, ``mixture.column``), and the
filter's removals, which the packing applies beside the clean stage's. DuckDB ``quality_removed``,
``quality_by_source`` and ``quality_by_cluster``; the figure ``quality/quality.png``. docs/quality.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from pipeline.data.gather import gather_shards, partition_shard, shard_facts
from pipeline.data.shard_docs import ShardDocs
from pipeline.data.stage import CorpusShardParams
from pipeline.quality import scorers
from pipeline.quality.filter import REASON, removed_mask
from pipeline.quality.report import distribution, plot_quality
from pipeline.quality.scorers import Prepared
from pipeline.quality.shards import score_file, score_shards
from pipeline.render.markdown import frame_table, image_markdown
from pipeline.stage import Connect, EngineParams, Markdown, StageResult, setting
from pipeline.storage.atomic import write_parquet
from pipeline.storage.warehouse import replace_rows


@dataclass(frozen=True)
class QualityParams(EngineParams):
    """The quality stage's settings (``quality_shards`` and ``quality``)."""

    quality: Any = setting()  # pipeline.config.QualityConfig
    corpus_shard: CorpusShardParams = setting(versioned=False, convert=CorpusShardParams)  # a partition's shard (corpus_shards')


def prepare(layout, params: QualityParams) -> Prepared:
    """The configured scorer's model, checked and fingerprinted (a trained scorer trains it once)."""
    return scorers.spec(params.quality.scorer).prepare(params.quality, layout.inside("quality", "models"))


def _score(layout, params: QualityParams, prepared: Prepared, shards: list[ShardDocs]) -> dict:
    return score_shards(shards, prepared, layout.shard_dir("quality"), layout.inside("work", "quality"), params)


def _parameters(params: QualityParams, prepared: Prepared) -> dict:
    q = params.quality
    return {"scorer": q.scorer, "model_key": prepared.key, "options": prepared.options}


def score_shard(layout, params: QualityParams, partition_key: str) -> StageResult:
    """One corpus shard's ``quality_shards`` partition: every training document's score,
    ``quality/shards/<validated>-<key>.npy``; a shard already scored by the same model is not read again."""
    shard = partition_shard(layout, params.corpus_shard, partition_key)
    prepared = prepare(layout, params)
    run = _score(layout, params, prepared, [shard])
    out = score_file(layout.shard_dir("quality"), shard, prepared.key)
    facts = shard_facts(shard, run, units=run["units"], model_key=prepared.key, **prepared.facts)
    if shard.n_docs:
        s = np.load(out)
        facts.update({"mean_score": round(float(s.mean()), 6), "median_score": round(float(np.median(s)), 6)})
    return StageResult(outputs=[out] if shard.n_docs else [], rows={"documents": shard.n_docs},
                       parameters={"shard": shard.unit, **_parameters(params, prepared)}, facts=facts)


def _documents(layout, scores: np.ndarray) -> pl.DataFrame:
    """doc_id, source, cluster, n_tokens (stream tokens: the ids and the EOS) and quality of every document."""
    docs = pl.read_parquet(layout.documents, columns=["doc_id", "source"]).sort("doc_id")
    clusters = pl.read_parquet(layout.clusters, columns=["doc_id", "cluster"]).sort("doc_id")
    stream = np.diff(np.load(layout.doc_offsets, allow_pickle=False)).astype(np.int64)
    if docs.height != scores.size or clusters.height != scores.size:
        raise RuntimeError(f"{scores.size} scores for {docs.height} documents and {clusters.height} clusters: "
                           "materialize tokens and clusters of the same corpus first")
    return docs.with_columns(cluster=clusters["cluster"], n_tokens=pl.Series(stream[: scores.size]), quality=pl.Series(scores))


def gather_quality(layout, params: QualityParams, connect: Connect) -> StageResult:
    """Every training document's score in doc_id order (the ``quality_shards`` files; a missing
    shard scored here), the filter applied: ``quality/documents.parquet``, the DuckDB tables and the figure."""
    prepared = prepare(layout, params)
    shard_dir = layout.shard_dir("quality")
    g = gather_shards(layout, "quality", lambda docs: _score(layout, params, prepared, docs),
                      lambda s: (score_file(shard_dir, s, prepared.key),))
    parts = [np.load(score_file(shard_dir, s, prepared.key)) for _, s, _ in g.parts()]
    rows = [r for _, _, r in g.parts()]
    scores = np.concatenate([p if r is None else p[r] for p, r in zip(parts, rows)]) if parts else np.zeros(0)
    f = params.quality.filter
    docs = _documents(layout, scores)
    gone = removed_mask(scores, docs["n_tokens"].to_numpy(), f.threshold, f.keep_top)
    docs = docs.with_columns(removed=pl.Series(gone))
    table = docs.select("doc_id", "quality", removed=pl.when(pl.col("removed")).then(pl.lit(REASON)).otherwise(None).cast(pl.String))
    out = write_parquet(table, layout.quality)
    by_source, by_cluster = distribution(docs, "source"), distribution(docs, "cluster")
    removed = pl.DataFrame({"reason": [REASON], "documents": [int(gone.sum())], "tokens": [int(docs["n_tokens"].to_numpy()[gone].sum())]})
    with connect() as con:
        replace_rows(con, "quality_removed", removed, {})
        replace_rows(con, "quality_by_source", by_source, {})
        replace_rows(con, "quality_by_cluster", by_cluster, {})
    png = plot_quality(docs, f.threshold, layout.inside("quality", "quality.png"))
    return StageResult(
        outputs=[out, png], rows={"documents": docs.height, "removed_docs": int(gone.sum())},
        parameters={**_parameters(params, prepared), "filter": f.model_dump()},
        facts={"scorer": params.quality.scorer, "model_key": prepared.key, **prepared.facts,
               "mean_score": round(float(scores.mean()), 6) if scores.size else None,
               f"tokens_removed_{REASON}": int(removed["tokens"][0]), "shards_scored_here": g.run["shards_computed"],
               "shards_reused": g.run["shards_reused"], "by_source": Markdown(frame_table(by_source)),
               "distribution": Markdown(image_markdown(png, "quality by source and by cluster"))},
        deps=g.deps("quality_shards"),
    )
