"""What the clean stage's table removes (and the quality stage's filter, ``quality/documents.parquet``),
as the stages after it read it: the documents the packing leaves out (and their tokens by reason),
the duplicate groups ``duplicate_separated`` keeps apart,
the ordering's documents without the removed ones. Apart from ``stage.py`` so the packing and the
ordering read the clean table without importing the cleaning itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.clean.plan import REASONS


def clean_file(layout) -> Path:
    """The clean stage's per-document table."""
    return layout.inside("clean", "documents.parquet")


def removed_documents(layout, quality: bool = False) -> pl.DataFrame | None:
    """doc_id and removed (the reason) of the documents the clean stage takes out of training and,
    with ``quality`` (``quality.enabled``), those the quality filter takes out (a document both
    remove keeps clean's reason); None when neither table is there (a data root cleaned by no run)
    or they remove nothing."""
    paths = [p for p in (clean_file(layout), layout.quality if quality else None) if p is not None and p.is_file()]
    if not paths:
        return None
    gone = pl.concat([pl.read_parquet(p, columns=["doc_id", "removed"]).filter(pl.col("removed").is_not_null()) for p in paths])
    gone = gone.unique("doc_id", keep="first", maintain_order=True).sort("doc_id") if len(paths) > 1 else gone
    return gone if gone.height else None


def applied_file(layout) -> Path:
    """The removals the packing applied (doc_id, removed): the clean stage's, less the documents a
    frozen prefix holds."""
    return layout.inside("sequences", "removed.parquet")


def applied_removals(layout) -> pl.DataFrame | None:
    """doc_id and removed of the documents the packing left out (``sequences/meta.json`` says
    whether it applied the clean stage's removals; a data root packed before ``removed.parquet``
    existed applied the clean table as it is), or None when it left none out."""
    meta = json.loads(layout.sequences_meta.read_text(encoding="utf-8")) if layout.sequences_meta.is_file() else {}
    if not meta.get("cleaned"):
        return None
    gone = pl.read_parquet(applied_file(layout)) if applied_file(layout).is_file() else removed_documents(layout)
    return gone if gone is not None and gone.height else None


def tokens_by_reason(gone: pl.DataFrame | None, stream: np.ndarray) -> dict[str, int]:
    """Stream tokens (ids and EOS) of the documents ``gone`` (doc_id, removed) by reason (every clean
    reason, 0 where none; ``quality`` when the quality filter removed any)."""
    out = dict.fromkeys(REASONS, 0)
    if gone is not None:
        tok = np.asarray(stream)[gone["doc_id"].to_numpy()].astype(np.int64)
        for reason, t in zip(gone["removed"].to_list(), tok.tolist()):
            out[reason] = out.get(reason, 0) + int(t)  # the quality filter's reason beside clean's
    return out


def group_keys(layout) -> pl.DataFrame | None:
    """doc_id and dup_group of the documents in a duplicate group (for ``dedup.action: separate``)."""
    path = clean_file(layout)
    if not path.is_file():
        return None
    return pl.read_parquet(path, columns=["doc_id", "dup_group"]).filter(pl.col("dup_group") >= 0)


def packed_stream(layout, stream: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    """The stream lengths the packing had to hold (the documents it left out, :func:`applied_removals`,
    at 0) and their tokens by reason: what the token-conservation check accounts every token of the
    corpus with."""
    gone = applied_removals(layout)
    if gone is None:
        return stream, tokens_by_reason(None, stream)
    kept = np.array(stream, copy=True)  # its dtype kept (int32 lengths stay 4 bytes a document)
    by_reason = tokens_by_reason(gone, kept)
    kept[gone["doc_id"].to_numpy()] = 0
    return kept, by_reason


def training_documents(layout, docs: pl.DataFrame) -> pl.DataFrame:
    """The ordering's documents table without the documents the packing left out
    (:func:`applied_removals`), and with a ``content_hash`` column (when it has one) equal within
    each duplicate group, so ``duplicate_separated`` separates near and semantic duplicates as it
    does exact ones."""
    gone = applied_removals(layout)
    if gone is not None:
        docs = docs.filter(~pl.col("doc_id").is_in(gone["doc_id"].implode()))
    groups = group_keys(layout) if "content_hash" in docs.columns else None
    if groups is not None and groups.height:
        docs = (docs.join(groups, on="doc_id", how="left")
                .with_columns(content_hash=pl.when(pl.col("dup_group").is_not_null())
                              .then(pl.format("group:{}", pl.col("dup_group"))).otherwise(pl.col("content_hash")))
                .drop("dup_group").sort("doc_id"))
    return docs
