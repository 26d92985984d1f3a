"""What a stage function returns: the files it wrote, its row counts, the parameters its result
depends on and the facts an asset shows (metadata, check results).

Each asset in ``assets/`` is one call of a stage function of ``pipeline/<stage>/stage.py``; the
asset records the returned :class:`StageResult` as its lineage row and its Dagster result
(``assets/common.py: Recorder.finish_stage``). The library never imports Dagster, so checks are
:class:`CheckFact` rows here and markdown is marked :class:`Markdown`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

# A DuckDB connection to the data root's warehouse, closed when the block ends (Dagster's
# ``DuckDBResource.get_connection``, or ``pipeline.storage.duck.duck_connection`` bound to a path).
Connect = Callable[[], AbstractContextManager[Any]]


class Markdown(str):
    """A metadata value shown as markdown (a table) rather than as plain text."""


@dataclass(frozen=True)
class CheckFact:
    """The result of one asset check, computed by the stage: ``warn`` checks never block."""

    name: str
    passed: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    description: str | None = None
    warn: bool = False


@dataclass
class StageResult:
    """One materialization's result: ``outputs`` (hashed into its data version), ``rows`` (row
    counts), ``parameters`` (what the result depends on, recorded in the lineage), ``facts``
    (metadata shown in the UI), ``checks`` and ``deps`` (upstream partitions to record instead of
    the asset's declared ones, e.g. the ordering an order was derived from) and ``digests`` (the
    SHA-256 of outputs that are not local files, e.g. objects written to an object store, taken
    while they were written)."""

    outputs: list[Path]
    rows: dict[str, int]
    parameters: dict[str, Any]
    facts: dict[str, Any] = field(default_factory=dict)
    checks: list[CheckFact] = field(default_factory=list)
    deps: dict[str, Any] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
