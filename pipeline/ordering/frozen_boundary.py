"""The frozen boundary of a strategy's stream, as the UI shows it: the stream's cumulative cluster
error at the frozen prefix's end and before and after it (``pipeline/packing/frozen.py`` records the
prefix; this measures it with the diagnostics' prefix errors)."""

from __future__ import annotations

import numpy as np
import polars as pl

from pipeline.ordering.composition import composition, log_spaced_points, prefix_errors
from pipeline.packing.frozen import load
from pipeline.storage.layout import Store


def boundary_errors(order: np.ndarray, segments: pl.DataFrame, doc_cluster: np.ndarray, n_frozen: int,
                    n_points: int = 64) -> dict[str, float]:
    """The stream's cumulative cluster error ||T(t) - tau S(t)|| / S(t) (tau: the whole stream's
    shares) at the frozen boundary, and its mean over log-spaced prefixes before and after it. A
    schedule (ids repeating or left out, ``greedy_blend``) is unrolled: position p is its own sequence."""
    m = int(order.size)
    if m != segments["sequence_id"].n_unique() or np.unique(order).size != m:
        pos = pl.DataFrame({"_position": np.arange(m, dtype=np.int64), "sequence_id": np.asarray(order, dtype=np.int64)})
        segments = pos.join(segments.with_columns(pl.col("sequence_id").cast(pl.Int64)), on="sequence_id").drop("sequence_id") \
            .rename({"_position": "sequence_id"})
        order = np.arange(m, dtype=np.int64)
    seq = segments["sequence_id"].to_numpy()
    comp = composition(seq, doc_cluster[segments["doc_id"].to_numpy()], segments["n_tokens"].to_numpy(), m, int(doc_cluster.max()) + 1)
    position = np.empty(m, np.int64)
    position[order] = np.arange(m)
    t = np.unique(np.r_[log_spaced_points(m, n_points), [n_frozen] if 0 < n_frozen <= m else []].astype(np.int64))
    err = prefix_errors(comp, position, t)
    before, after = err[t <= n_frozen], err[(t > n_frozen) & (t < m)]
    return {"error_at_boundary": float(err[t == n_frozen][0]) if n_frozen in t else 0.0,
            "error_before_mean": float(before.mean()) if before.size else 0.0,
            "error_after_mean": float(after.mean()) if after.size else 0.0}


def boundary_summary(layout, strategy: str) -> dict | None:
    """The frozen boundary of ``strategy``'s written ordering, as the UI shows it: P, the version,
    the prefix digest, the version chain and :func:`boundary_errors`; None without a frozen prefix."""
    rec = load(layout, strategy)
    if rec is None or not layout.ordering(strategy).exists():
        return None
    ordering = Store(layout).ordering(strategy)
    clusters = pl.read_parquet(layout.clusters)
    cluster = np.zeros(int(clusters["doc_id"].max()) + 1, np.int64)
    cluster[clusters["doc_id"].to_numpy()] = clusters["cluster"].to_numpy()
    errors = boundary_errors(ordering.order, ordering.segments, cluster, rec.sequences)
    chain = rec.meta.get("chain", [])
    return {"frozen_sequences": rec.sequences, "frozen_version": chain[-1]["version"] if chain else 0,
            "frozen_tokens_sha256": rec.meta.get("tokens_sha256", ""), "version_chain": chain,
            **{f"cluster_{k}": v for k, v in errors.items()}}
