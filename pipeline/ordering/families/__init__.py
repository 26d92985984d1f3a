"""The characteristic families' registry: one :class:`FamilySpec` per family, one module per family
in this folder, plugins through ``STRATA_PLUGINS`` (``pipeline/registry.py``).

A family is a trait of a sequence the greedy holds at its share of the stream (Don't Shuffle,
Optimize's "characteristics"; ``pipeline.ordering.characteristics`` has the objective). Its spec
says what its matrix x^f is (one row per sequence) and how it is held and scored:

- :class:`TokenFamily` (``level="tokens"``): ``tokens(features)`` gives x^f_{s,g}, the tokens of
  sequence s in group g; the target of group g is its share of all tokens;
- :class:`SequenceFamily` (``level="sequences"``): ``values(features)`` gives one number per
  sequence; the base class cuts the values into quantile classes (the family's ``classes``) and
  the target of a class is its share of the sequences.

That is the one method a family writes; the rest is the base classes' and the registry's. A
token family with ``repaired=True`` is also held per training batch by the greedy's swap repair
(``pipeline.ordering.repair``: a batch's score is the worst of these families' share deviations),
and one with ``diagnosed`` set is scored by the ordering diagnostics
(``pipeline.reports.diagnostics``: ``batch_dev_<diagnosed>_*`` and ``prefix_error_<diagnosed>``)
through ``composition(schedule)``, its groups' tokens per sequence of a prepared schedule.

A family name the registry lacks is a column of the documents table (e.g. ``source``, or a corpus
column ``corpus.columns`` declares): a token family whose groups are the column's categories, or a
numeric column's token quartiles (:func:`spec_of`). Nothing else lists the
families: the configuration's ``families:`` check, the greedy's matrix, the engine's documents
columns, the curriculum's accepted families, the repair and the diagnostics read this registry.
Spec modules import their code at their top, and nothing heavy (``pipeline/heavy.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import polars as pl

from pipeline import registry
from pipeline.errors import StrataInputError
from pipeline.ordering.features import one_hot, quantile_classes
from pipeline.ordering.quantiles import BINS, token_quantile_bins
from pipeline.registry import Registry

if TYPE_CHECKING:
    from pipeline.ordering.composition import Composition, Schedule
    from pipeline.ordering.features import Csr, SequenceFeatures

Level = Literal["tokens", "sequences"]


class FamilySpec:
    """One characteristic family: its name, level and description, and how x^f is computed."""

    name: str
    level: Level
    description: str
    repaired: bool = False  # the swap repair scores each batch's share of its groups (token families)
    diagnosed: str | None = None  # the ordering diagnostics' name of its metrics (None: not diagnosed)
    column: str | None = None  # a documents column the engine reads for it (its codes: features.columns[name])

    def codes(self, docs: "pl.DataFrame") -> np.ndarray:
        """Each row of ``docs`` (the ordering's documents, with ``column`` and ``n_tokens``) as a dense group id 0..G-1."""
        return docs[self.column].cast(pl.String).fill_null("").rank("dense").to_numpy().astype(np.int64) - 1

    def matrix(self, features: "SequenceFeatures", classes: int, unit: float) -> "Csr":
        """x^f for every row of ``features``, unscaled by the family's weight (``classes``: the
        objective's quantile classes of a sequence family)."""
        raise NotImplementedError

    def composition(self, schedule: "Schedule") -> "Composition | None":
        """Its groups' tokens per sequence of a prepared schedule, for the diagnostics (``diagnosed``)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class TokenFamily(FamilySpec):
    """A family of token groups: x^f_{s,g} = tokens of sequence s in group g, target = g's token share."""

    level: Level = "tokens"

    def tokens(self, features: "SequenceFeatures") -> "Csr":
        """The (sequences x groups) token counts, columns ascending within a row."""
        raise NotImplementedError

    def matrix(self, features: "SequenceFeatures", classes: int, unit: float) -> "Csr":
        return self.tokens(features)


class SequenceFamily(FamilySpec):
    """A family of sequence classes: quantile classes of ``values`` (``classes`` of them, ties
    merge classes), a sequence counting ``unit`` (= mean l_s) in its class column, target = the
    class's share of the sequences."""

    level: Level = "sequences"

    def values(self, features: "SequenceFeatures") -> np.ndarray:
        """One number per row of ``features``."""
        raise NotImplementedError

    def matrix(self, features: "SequenceFeatures", classes: int, unit: float) -> "Csr":
        return one_hot(quantile_classes(self.values(features), classes), unit)


class ColumnFamily(TokenFamily):
    """A documents column named as a family (e.g. ``source``): tokens per category of the column,
    which the engine reads into ``features.columns`` (``OrderParams.column_families``)."""

    description = "tokens per category of this documents column (a float column: per token quartile of its values)"

    def __init__(self, name: str):
        self.name = name
        self.column = name

    def codes(self, docs: "pl.DataFrame") -> np.ndarray:
        """A string or integer column's categories (integers are codes, e.g. a source's number); a
        float one (a score: ``corpus.columns``' numbers are Float64) in its token quartiles, as
        ``quality_bin`` cuts the quality score: its distinct values are no groups."""
        if not docs[self.column].dtype.is_float():
            return super().codes(docs)
        values = docs[self.column].cast(pl.Float64).fill_null(float("nan")).to_numpy()
        return token_quantile_bins(values, docs["n_tokens"].to_numpy(), BINS)

    def tokens(self, features: "SequenceFeatures") -> "Csr":
        if self.name not in features.columns:
            have = ", ".join([*REGISTRY.names(), *features.columns])
            raise StrataInputError(
                f"no characteristic {self.name!r} for these sequences",
                fix=f"use one of {have} (a documents column becomes a family when the orderings asset reads it: docs/ordering.md)",
            )
        return features.columns[self.name]


REGISTRY: Registry[FamilySpec] = registry.FAMILIES  # declared in pipeline/registry.py, where the config reads it


def spec_of(name: str) -> FamilySpec:
    """The registered family ``name``, else the documents column of that name."""
    return REGISTRY.entries().get(name) or ColumnFamily(name)


def names(*levels: Level) -> tuple[str, ...]:
    """The registered families (of these levels), in registry order."""
    return tuple(n for n, s in REGISTRY.entries().items() if not levels or s.level in levels)


def repaired() -> tuple[FamilySpec, ...]:
    """The token families the swap repair scores, in registry order."""
    return tuple(s for s in REGISTRY.entries().values() if isinstance(s, TokenFamily) and s.repaired)


def diagnosed() -> tuple[FamilySpec, ...]:
    """The families the ordering diagnostics score, in registry order."""
    return tuple(s for s in REGISTRY.entries().values() if s.diagnosed)


def __getattr__(attr: str) -> Any:
    """``TOKEN_FAMILIES`` / ``SEQUENCE_FAMILIES``: the registered families of each level."""
    if attr == "TOKEN_FAMILIES":
        return names("tokens")
    if attr == "SEQUENCE_FAMILIES":
        return names("sequences")
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
