"""The blend's group names against the corpus's values, checked as soon as the corpus is built.

``greedy_blend`` realizes weights over the groups of a documents column (``mixture.column``,
docs/mixture.md "Blends"). Where that column comes from the corpus (``source``, ``subdomain``, a
declared ``corpus.columns`` column), its values are known once ``corpus.parquet`` is written, so a
group the blend names that the corpus does not hold stops the run there, before the tokenizer, the
embeddings and the clustering, rather than at the ordering after all of them.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline.config import MixtureConfig
from pipeline.errors import StrataInputError

BLEND_STRATEGY = "greedy_blend"  # the strategy that reads mixture.weights / mixture.stages
LATER_COLUMNS = ("n_tokens", "n_chars", "n_bytes", "cluster", "quality")  # documents columns Strata computes after the corpus


def named_groups(mixture: MixtureConfig) -> list[tuple[str, list[str]]]:
    """(config key, the group names it gives) of every key of a blend that names groups."""
    keys = [("mixture.weights", list(mixture.weights))] if mixture.weights else [
        (f"mixture.stages[{i}].weights", list(s.weights)) for i, s in enumerate(mixture.stages)]
    keys += [(f"mixture.{k}", list(getattr(mixture, k))) for k in ("max_repetition", "max_fraction")]
    return [(k, [str(n) for n in names]) for k, names in keys if names]


def check_blend_names(corpus: Path, mixture: MixtureConfig, strategies: list[str] | tuple[str, ...]) -> None:
    """Stop with the key, the unknown group and the values the corpus holds when a blend
    ``greedy_blend`` realizes names a group its corpus column does not hold. Nothing to check
    without a blend or ``greedy_blend``, for a binned column (groups "0".."n-1") or a column the
    corpus lacks (one Strata computes later: the ordering checks it); a column that is neither
    (not declared in ``corpus.columns``) stops with the columns there are."""
    if BLEND_STRATEGY not in strategies or not (mixture.weights or mixture.stages):
        return
    schema = pl.read_parquet_schema(corpus)
    if mixture.column not in schema and mixture.column not in LATER_COLUMNS:
        options = sorted({*schema, *LATER_COLUMNS} - {"doc_id", "content_hash", "shard", "shard_row"})
        raise StrataInputError(f"mixture.column names {mixture.column!r}, which is no column of the documents", path=corpus,
                               fix=f"use one of {options}; a field of your corpus records becomes a documents column when "
                                   f"corpus.columns declares it, e.g. corpus: {{columns: {{{mixture.column}: number}}}} "
                                   "(docs/mixture.md, \"Your corpus's own columns\")")
    if mixture.bins or mixture.column not in schema:
        return
    values = sorted(pl.read_parquet(corpus, columns=[mixture.column])[mixture.column].drop_nulls().cast(pl.String).unique().to_list())
    for key, names in named_groups(mixture):
        unknown = [n for n in names if n not in values]
        if unknown:
            raise StrataInputError(f"{key} names the group {unknown[0]!r}, which the corpus column {mixture.column!r} does not hold "
                                   f"(its training documents hold {len(values)} values)", path=corpus,
                                   fix=f"name groups among {values[:50]}{' ...' if len(values) > 50 else ''} "
                                       f"(mixture.column: {mixture.column}), or correct the corpus")
