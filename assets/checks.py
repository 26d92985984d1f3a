"""Asset checks that prove nothing was lost: token conservation and cluster coverage."""


import dagster as dg
import numpy as np
import polars as pl

from assets.common import StrataSettings


@dg.asset_check(asset="sequences", blocking=True, description="Every token of every document appears exactly once in the sequences, except the reported tail.")
def token_conservation(settings: StrataSettings) -> dg.AssetCheckResult:
    layout = settings.layout()
    offsets = np.load(layout.doc_offsets, allow_pickle=False)
    stream = np.diff(offsets)
    seg = pl.read_parquet(layout.segments)
    cfg = settings.config()
    per_doc = np.bincount(seg["doc_id"].to_numpy(), weights=seg["n_tokens"].to_numpy(), minlength=stream.size).astype(np.int64)
    m = int(seg["sequence_id"].max()) + 1
    dropped = int(stream.sum() - per_doc.sum())
    # Spans must tile each sequence exactly and never overlap within a document.
    fill = np.bincount(seg["sequence_id"].to_numpy(), weights=seg["n_tokens"].to_numpy(), minlength=m)
    starts = seg.sort("doc_id", "doc_token_start")
    contiguous = starts.with_columns(
        gap=pl.col("doc_token_start") - (pl.col("doc_token_start") + pl.col("n_tokens")).shift(1).over("doc_id")
    )["gap"].drop_nulls()
    first = starts.group_by("doc_id").agg(pl.col("doc_token_start").min())["doc_token_start"]
    passed = bool(
        (per_doc <= stream).all() and (fill == cfg.seq_len).all() and (contiguous == 0).all()
        and (first == 0).all() and 0 <= dropped < cfg.seq_len
    )
    return dg.AssetCheckResult(
        passed=passed,
        metadata={"tokens_in": int(stream.sum()), "tokens_packed": int(per_doc.sum()), "tokens_dropped": dropped, "sequences": m},
    )


@dg.asset_check(asset="clusters", blocking=True, description="Every training document has exactly one cluster in [0, k).")
def clusters_cover_documents(settings: StrataSettings) -> dg.AssetCheckResult:
    layout = settings.layout()
    cl = pl.read_parquet(layout.clusters)
    n_docs = pl.read_parquet(layout.corpus, columns=["doc_id"]).height
    k = settings.config().k
    ok = cl.height == n_docs and cl["doc_id"].n_unique() == n_docs and cl["cluster"].min() >= 0 and cl["cluster"].max() < k
    return dg.AssetCheckResult(passed=bool(ok), metadata={"documents": n_docs, "assigned": cl.height})


@dg.asset_check(asset="embeddings", blocking=True, description="Embeddings are finite and unit-norm.")
def embeddings_normalized(settings: StrataSettings) -> dg.AssetCheckResult:
    emb = np.load(settings.layout().embeddings, allow_pickle=False)
    norms = np.linalg.norm(emb, axis=1)
    ok = bool(np.isfinite(emb).all() and np.allclose(norms, 1.0, atol=1e-3))
    return dg.AssetCheckResult(passed=ok, metadata={"min_norm": float(norms.min()), "max_norm": float(norms.max())})
