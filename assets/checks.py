"""Asset checks that prove nothing was lost: token conservation and cluster coverage."""


import dagster as dg
import numpy as np
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.common import StrataSettings
from pipeline.clean.stage import packed_stream
from pipeline.packing.frozen import load_all
from pipeline.packing.pack import conservation


@dg.asset_check(asset="sequences", blocking=True,
                description="Every token of every document appears exactly once in the sequences, except the reported dropped tail "
                            "and the documents the clean stage removed (their tokens by reason).")
def token_conservation(settings: StrataSettings, duckdb: DuckDBResource) -> dg.AssetCheckResult:
    layout, cfg = settings.layout(), settings.config()
    corpus_stream = np.diff(np.load(layout.doc_offsets, allow_pickle=False))
    stream, removed = packed_stream(layout, corpus_stream)  # the clean stage's removals, by reason (docs/cleaning.md)
    # around a frozen prefix, dropped tails may lie mid-document (pipeline/packing/frozen.py)
    result = conservation(pl.read_parquet(layout.segments), stream, cfg.seq_len, gaps=bool(load_all(layout)))
    with duckdb.get_connection() as con:
        reported = dict(con.execute("SELECT metric, value FROM packing_stats").fetchall())
    passed = (bool(result["ok"]) and result["tokens_dropped"] == reported.get("tokens_dropped")
              and all(t == reported.get(f"tokens_removed_{r}", 0) for r, t in removed.items()))
    meta = ({k: v for k, v in result.items() if k != "ok"} | {"reported_dropped": reported.get("tokens_dropped")}
            | {"tokens_in_corpus": int(corpus_stream.sum())} | {f"tokens_removed_{r}": t for r, t in removed.items()})
    return dg.AssetCheckResult(passed=passed, metadata=meta)


@dg.asset_check(asset="clusters", blocking=True, description="Every training document has exactly one cluster in [0, k).")
def clusters_cover_documents(settings: StrataSettings) -> dg.AssetCheckResult:
    layout = settings.layout()
    cl = pl.read_parquet(layout.clusters)
    n_docs = pl.read_parquet(layout.corpus, columns=["doc_id"]).height
    k = np.load(layout.centroids, mmap_mode="r").shape[0]  # the k it was built with (a launchpad run may override k)
    ok = cl.height == n_docs and cl["doc_id"].n_unique() == n_docs and cl["cluster"].min() >= 0 and cl["cluster"].max() < k
    return dg.AssetCheckResult(passed=bool(ok), metadata={"documents": n_docs, "assigned": cl.height})


@dg.asset_check(asset="embeddings", blocking=True, description="Embeddings are finite and unit-norm.")
def embeddings_normalized(settings: StrataSettings) -> dg.AssetCheckResult:
    """Over every row of the shard files the matrix indexes: the norm range ``embed_shards`` took
    while writing each file, where its record matches the file's bytes; else read from the file
    (:mod:`pipeline.represent.embedding_norms`)."""
    from pipeline.represent.embedding_index import open_embeddings
    from pipeline.represent.embedding_norms import NormRange, shard_norms

    total, recorded = NormRange(), 0
    for path in dict.fromkeys(open_embeddings(settings.layout()).runs.paths):
        norms, from_record = shard_norms(path)
        total, recorded = total.merge(norms), recorded + from_record
    lo, hi = total.min_norm, total.max_norm
    ok = total.finite and abs(lo - 1.0) <= 1e-3 and abs(hi - 1.0) <= 1e-3
    return dg.AssetCheckResult(passed=bool(ok), metadata={"min_norm": lo, "max_norm": hi, "shard_rows": total.rows,
                                                          "shards_from_records": recorded})
