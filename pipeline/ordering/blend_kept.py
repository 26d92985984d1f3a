"""A blend's groups against what the clean stage left: a group whose every document the clean
stage removed is named as such (duplicates, contamination), not as a group the column lacks."""

from __future__ import annotations

import polars as pl

from pipeline.clean.removals import applied_removals
from pipeline.errors import StrataInputError
from pipeline.storage.layout import Store


def check_groups_kept(layout, blend) -> None:
    """Stop, naming the group, how many of its documents were removed and why, when a group the
    blend names (weights, stages or caps) has documents in the corpus and none left for training.
    Nothing to check for a binned column (its groups are the training documents' quantiles)."""
    gone = applied_removals(layout)
    if gone is None or blend.bins:
        return
    col = blend.column
    have = pl.read_parquet_schema(layout.documents)
    if col in have:
        values = Store(layout).document_clusters([col]).select("doc_id", col)
    elif col in pl.read_parquet_schema(layout.corpus):
        values = pl.read_parquet(layout.corpus, columns=["doc_id", col])
    else:
        return  # the ordering names the columns there are
    values = values.with_columns(pl.col(col).cast(pl.String)).join(gone, on="doc_id", how="left")
    kept = set(values.filter(pl.col("removed").is_null())[col].drop_nulls().to_list())
    named = {n for stage in blend.weights for n, _ in stage} | {n for n, _ in (*blend.max_repetition, *blend.max_fraction)}
    for name in sorted(named - kept):
        removed = values.filter(pl.col(col) == name)
        if removed.height:
            why = ", ".join(f"{n} {r}" for r, n in sorted(removed.group_by("removed").len().iter_rows(), key=lambda t: -t[1]))
            raise StrataInputError(
                f"the clean stage removed every document of the group {name!r} (mixture.column {col}): {removed.height} documents "
                f"({why}); see clean/documents.parquet (column removed) and DuckDB clean_removed",
                fix=f"drop {name!r} from the blend (mixture.weights / mixture.stages, max_repetition, max_fraction), or keep its "
                    "documents (dedup.action, dedup.enabled: false, or the decontamination settings)")
