"""Diagnostics of the stream a run actually consumed (the sequence ids served, step by step).

An ordering's own diagnostics describe the schedule; these describe what training saw: the
first ``steps x batch_size`` ids of the order (wrapping into a next epoch) or, for a
training-time strategy such as ODM, the ids its sampler served (which may repeat sequences).
Metrics, per run (Diversity-ordered training's table, per sequence and per batch):

- ``clusters_per_seq_{mean,min,std}``: distinct clusters in each consumed sequence;
- ``clusters_per_batch_{mean,min,std}``: distinct clusters in each training batch;
- ``batch_share_dev_{mean,max}``: per batch, max_k |token share of cluster k in the batch -
  its token share in the whole packing| (Don't Shuffle, Optimize's per-batch deviation).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError

METRICS = (
    "clusters_per_seq_mean", "clusters_per_seq_min", "clusters_per_seq_std",
    "clusters_per_batch_mean", "clusters_per_batch_min", "clusters_per_batch_std",
    "batch_share_dev_mean", "batch_share_dev_max",
)


def consumed_diversity(stream: np.ndarray, segments: pl.DataFrame, doc_cluster: np.ndarray, batch_size: int) -> dict[str, float]:
    """The metrics above for ``stream`` (sequence ids in training order) over ``segments``."""
    stream = np.asarray(stream, dtype=np.int64)
    if stream.size == 0 or batch_size < 1:
        raise StrataInputError("no consumed stream to describe", fix="train at least one step")
    doc_cluster = np.asarray(doc_cluster, dtype=np.int64)
    seg = pl.DataFrame({
        "seq": segments["sequence_id"].cast(pl.Int64),
        "cluster": doc_cluster[segments["doc_id"].to_numpy()],
        "tokens": segments["n_tokens"].cast(pl.Int64),
    }).group_by("seq", "cluster").agg(pl.col("tokens").sum())
    total = seg.group_by("cluster").agg(pl.col("tokens").sum().alias("all"))
    total = total.with_columns(share=pl.col("all") / pl.col("all").sum())
    served = pl.DataFrame({"seq": stream, "batch": np.arange(stream.size) // batch_size})
    per_seq = served.join(seg.group_by("seq").agg(pl.len().alias("n")), on="seq", how="left")
    if per_seq["n"].null_count():
        raise StrataInputError("the stream names a sequence the segments lack", fix="pass the segments of the packing trained on")
    in_batch = served.join(seg, on="seq").group_by("batch", "cluster").agg(pl.col("tokens").sum())
    # sorted by batch: a mean or std summed in group_by's arbitrary row order differs in the last bit run to run
    per_batch = in_batch.group_by("batch").agg(pl.len().alias("n")).sort("batch")
    dev = (
        in_batch.with_columns(bshare=pl.col("tokens") / pl.col("tokens").sum().over("batch"))
        .join(pl.DataFrame({"batch": per_batch["batch"]}).join(total.select("cluster", "share"), how="cross"),
              on=["batch", "cluster"], how="right")
        .with_columns(d=(pl.col("bshare").fill_null(0.0) - pl.col("share")).abs())
        .group_by("batch").agg(pl.col("d").max()).sort("batch")["d"].to_numpy()
    )
    s, b = per_seq["n"].to_numpy().astype(np.float64), per_batch["n"].to_numpy().astype(np.float64)
    return {
        "clusters_per_seq_mean": float(s.mean()), "clusters_per_seq_min": float(s.min()), "clusters_per_seq_std": float(s.std()),
        "clusters_per_batch_mean": float(b.mean()), "clusters_per_batch_min": float(b.min()), "clusters_per_batch_std": float(b.std()),
        "batch_share_dev_mean": float(dev.mean()), "batch_share_dev_max": float(dev.max()),
    }
